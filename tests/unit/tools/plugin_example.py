"""A tool plug-in used by the tests (as `tests.unit.tools.plugin_example:lookup_price`)."""

from __future__ import annotations

PRICES = {"apple": 3, "pear": 5}


def lookup_price(item: str, quantity: int = 1) -> str:
    """Price of a fruit in cents.

    Args:
        item: The fruit's name.
        quantity: How many.
    """
    return str(PRICES[item] * quantity)


NOT_A_FUNCTION = 3
