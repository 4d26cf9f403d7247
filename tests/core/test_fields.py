from __future__ import annotations

import pytest

from tidal.core.fields import require_int, require_number


def test_require_int_bounds_and_refuses_bools_and_floats() -> None:
    require_int("C.n", 8, 1, 8)
    require_int("C.n", 10**6, 0)
    for v in (0, 9, True, 2.0):
        with pytest.raises(ValueError, match=rf"^C\.n must be an integer >= 1 and <= 8, got {v!r}$"):
            require_int("C.n", v, 1, 8)


def test_require_number_is_finite_and_above_or_from_its_floor() -> None:
    require_number("C.x", 0.0, 0.0, strict=False)
    require_number("C.x", 3, 0.0, strict=True)
    for v, strict, says in ((0.0, True, "> 0, got 0.0"), (-1, False, ">= 0, got -1"),
                            (float("nan"), False, ">= 0, got nan"), (float("inf"), True, "> 0, got inf"),
                            (False, False, ">= 0, got False")):
        with pytest.raises(ValueError, match=rf"^C\.x must be a finite number {says}$"):
            require_number("C.x", v, 0.0, strict=strict)
