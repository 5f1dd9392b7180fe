"""Judge + solution launcher for backends that give one machine per job (E2B; stdlib only).

Starts the solution server (`solution/_rlvr_run.py`) and the judge (`judge/_rlvr_judge.py`)
as two processes wired by two pipes, forwards the judge's events on stdout, and stops the
solution when the judge is done. Weaker than the local backend, where each side has its own
sandbox: here they share a machine and a uid, so only process separation stands between them.
"""

import os
import subprocess
import sys


def main():
    python = sys.executable
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    here = os.path.dirname(os.path.abspath(__file__))
    solution = subprocess.Popen(
        [python, "-I", "-S", "-B", "_rlvr_run.py"], cwd=os.path.join(here, "solution"), stdin=req_r, stdout=rep_w
    )
    judge = subprocess.Popen(
        [python, "-I", "-S", "-B", "_rlvr_judge.py", str(req_w)],
        cwd=os.path.join(here, "judge"),
        stdin=rep_r,
        pass_fds=(req_w,),
    )
    for fd in (req_r, req_w, rep_r, rep_w):
        os.close(fd)
    code = judge.wait()
    solution.kill()
    solution.wait()
    sys.exit(code)


if __name__ == "__main__":
    main()
