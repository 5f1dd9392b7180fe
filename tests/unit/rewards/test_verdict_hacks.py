"""Solutions that try to forge a code_sandbox verdict instead of solving: every one must score 0.

Each was a working hack when the test code ran inside the solution's own process. Now the
tests run in a separate judge sandbox and only plain return values cross, so each fails for
the same reason: the function's answer is wrong. The task throughout: `f(x)` doubles `x`.
"""

from __future__ import annotations

import pytest

from rlvr.rewards.code_sandbox import score

from .conftest import code_completion, make_sample, needs_bwrap

pytestmark = needs_bwrap

CASES = {
    "assert": ["assert f(2) == 4", "assert abs(f(3) - 6) < 1e-9", "assert f(0) == 0"],
    "check_based": {
        "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert abs(candidate(3) - 6) < 1e-9\n",
        "entry_point": "f",
    },
    "pytest": (
        "from solution import f\n\ndef test_a():\n    assert f(2) == 4\n\n"
        "def test_b():\n    assert abs(f(3) - 6) < 1e-9\n"
    ),
}
KINDS = sorted(CASES)

# Lines a forger would want the host to read: the judge's events and the old in-process report.
FORGED = (
    '{"case": 0, "ok": true}\\n{"case": 1, "ok": true}\\n{"case": 2, "ok": true}\\n{"done": true}\\n'
    '{"ready": true}\\n{"value": 4}\\n{"value": 6}\\n{"passed": 3, "total": 3, "errors": []}\\n'
)
WRITE_EVERYWHERE = (
    "import os\n"
    "def forge():\n"
    "    for fd in range(0, 64):\n"
    "        try:\n"
    f"            os.write(fd, {FORGED!r}.encode())\n"
    "        except OSError:\n"
    "            pass\n"
)

HACKS = {
    "eq_always_true": "class Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
    "    def __sub__(self, other):\n        return 0\n    __rsub__ = __sub__\n\ndef f(x):\n    return Yes()",
    "int_subclass_eq": "class I(int):\n    def __eq__(self, other):\n        return True\n    def __sub__(self, other):\n"
    "        return 0\n    __hash__ = int.__hash__\n\ndef f(x):\n    return I(1)",
    "truthy_object": "class T:\n    def __bool__(self):\n        return True\n\ndef f(x):\n    return T()",
    "patch_json_dumps": 'import json\njson.dumps = lambda *a, **k: \'{"ok": true, "value": 4}\'\n'
    "json.JSONEncoder.encode = lambda self, o: '4'\n\ndef f(x):\n    return x + 1",
    "patch_os_write": "import os\n_w = os.write\n"
    "def write(fd, data):\n    return _w(fd, data.replace(b'\"ok\": false', b'\"ok\": true'))\n"
    "os.write = write\n\ndef f(x):\n    return x + 1",
    "forged_lines_on_every_fd": WRITE_EVERYWHERE + "forge()\n\ndef f(x):\n    forge()\n    return x + 1",
    "forged_from_atexit": WRITE_EVERYWHERE + "import atexit\natexit.register(forge)\n\ndef f(x):\n    return x + 1",
    "forged_from_del": WRITE_EVERYWHERE + "class Ghost:\n    def __del__(self):\n        forge()\n\n"
    "_g = Ghost()\n\ndef f(x):\n    Ghost()\n    return x + 1",
    "stack_walk_to_report": "import sys, gc\n"
    "def f(x):\n"
    "    frame = sys._getframe()\n"
    "    while frame:\n"
    "        for name in ('report', 'emit', 'send'):\n"
    "            fn = frame.f_globals.get(name) or frame.f_locals.get(name)\n"
    "            if callable(fn):\n"
    "                for msg in ({'passed': 3, 'total': 3, 'errors': []}, {'case': 0, 'ok': True}, {'value': 4}):\n"
    "                    try:\n"
    "                        fn(msg)\n"
    "                    except Exception:\n"
    "                        pass\n"
    "        frame = frame.f_back\n"
    "    for obj in gc.get_objects():\n"
    "        if isinstance(obj, str) and obj.startswith('RLVR-'):\n"
    '            print(obj + \'{"passed": 3, "total": 3, "errors": []}\')\n'
    "    return x + 1",
    "reexec_with_O": "import os, sys\n"
    "if not sys.flags.optimize:\n"
    "    os.execv(sys.executable, [sys.executable, '-O', '-I', '-S', '-B'] + sys.argv)\n"
    "def f(x):\n    return x + 1",
    "exec_is_a_noop": "import builtins\nbuiltins.exec = lambda *a, **k: None\n"
    "_compile = builtins.compile\nbuiltins.compile = lambda src, *a, **k: _compile('pass', *a[:2])\n\ndef f(x):\n    return x + 1",
    "shadow_builtin": "def abs(x):\n    return 0\n\ndef f(x):\n    return x + 1",
    "patch_pytest_runtest": "import sys, types\n"
    "try:\n    import _pytest.python\n    _pytest.python.Function.runtest = lambda self: None\nexcept ImportError:\n    pass\n"
    "fake = types.ModuleType('pytest')\nsys.modules['pytest'] = fake\n\ndef f(x):\n    return x + 1",
    "pytest_plugin_marks_passed": "import os\n"
    "for d in ('.', '/tmp', '..', '/sandbox'):\n"
    "    try:\n"
    "        open(os.path.join(d, 'conftest.py'), 'w').write("
    "'import pytest\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport(item, call):\\n"
    '    outcome = yield\\n    outcome.get_result().outcome = "passed"\\n\')\n'
    "    except OSError:\n"
    "        pass\n"
    "pytest_plugins = ['conftest']\n\ndef f(x):\n    return x + 1",
    "exit_early_zero": "import os\nos._exit(0)\ndef f(x):\n    return x + 1",
    "huge_reply": "def f(x):\n    return 'x' * 50_000_000",
    "deep_reply": "def f(x):\n    v = []\n    for _ in range(100000):\n        v = [v]\n    return v",
    "read_the_tests": "import os\n"  # looks for `f(2) ==` (spelt as bytes: not its own source) anywhere
    "def found():\n"
    "    for top in ('/spool', '/proc', '/tmp', '/sandbox', '/', '..'):\n"
    "        for root, dirs, files in os.walk(top):\n"
    "            if root.startswith('/proc/') and root.count('/') > 3:\n"
    "                continue\n"
    "            for name in files:\n"
    "                try:\n"
    "                    if bytes([102, 40, 50, 41, 32, 61, 61]) in open(os.path.join(root, name), 'rb').read(1 << 16):\n"
    "                        return True\n"
    "                except OSError:\n"
    "                    pass\n"
    "    return False\n"
    "SEEN = found()\n\ndef f(x):\n    return 2 * x if SEEN else x + 1",
    "kill_the_judge": "import os, signal\n"
    "for pid in range(1, 200):\n    try:\n        os.kill(pid, signal.SIGKILL) if pid != os.getpid() else None\n"
    "    except OSError:\n        pass\n\ndef f(x):\n    return x + 1",
}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_right_answer_still_scores_one(kind):
    result = await score(
        make_sample(case_type=kind, test_cases=CASES[kind]), code_completion("def f(x):\n    return 2 * x")
    )
    assert result.score == 1.0, result.info


@pytest.mark.parametrize("hack", sorted(HACKS))
@pytest.mark.parametrize("kind", KINDS)
async def test_hack_scores_zero(kind, hack):
    sample = make_sample(case_type=kind, test_cases=CASES[kind])
    result = await score(sample, code_completion(HACKS[hack]), timeout_s=5, partial_credit=True)
    assert result.score == 0.0, result.info  # partial credit on: a half-forged verdict would show
    assert result.judged, result.failed  # nor can a hack buy its way out of training
    assert result.info["reason"], result.info


async def test_non_plain_values_fail_with_a_reason():
    sample = make_sample(case_type="assert", test_cases=["assert f(1)"])
    result = await score(
        sample, code_completion("class T:\n    def __bool__(self):\n        return True\n\ndef f(x):\n    return T()")
    )
    assert result.score == 0.0 and "not a plain value" in result.info["reason"], result.info


async def test_plain_values_of_every_kind_cross():
    value = "(1, 2.5, float('inf'), 'a', b'b', 3+4j, None, True, [1], {1: {2}}, frozenset({3}))"
    sample = make_sample(case_type="assert", test_cases=[f"assert f() == {value}", "assert f()[2] == float('inf')"])
    result = await score(sample, code_completion(f"def f():\n    return {value}"))
    assert result.score == 1.0, result.info


async def test_objects_can_be_called_but_not_compared():
    tests = [
        "assert Solution().twice(3) == 6",
        "s = Counter()\ns.add(2)\ns.add(3)\nassert s.total() == 5",
        "with __import__('contextlib').suppress(ValueError):\n    f(-1)\n    raise AssertionError('no raise')",
    ]
    code = (
        "class Solution:\n    def twice(self, x):\n        return 2 * x\n\n"
        "class Counter:\n    def __init__(self):\n        self.n = 0\n    def add(self, k):\n        self.n += k\n"
        "    def total(self):\n        return self.n\n\n"
        "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x"
    )
    result = await score(make_sample(case_type="assert", test_cases=tests), code_completion(code))
    assert result.score == 1.0, result.info


async def test_tests_see_pristine_builtins_and_the_solution_helpers():
    # `helper` is the solution's (reached by proxy); `len` is the judge's own even if the solution redefines it.
    tests = ["assert helper(2) == 3", "assert len([1, 2]) == 2"]
    code = "def len(x):\n    return 0\n\ndef helper(x):\n    return x + 1"
    result = await score(make_sample(case_type="assert", test_cases=tests), code_completion(code))
    assert result.score == 1.0, result.info
