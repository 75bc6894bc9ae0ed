"""SLO bounds read once into a typed value: seconds in the order written, the report's columns' order."""

from __future__ import annotations

import pytest

from latlab.common.user_input import Slos, UserError


def test_slos_keep_the_order_written_and_know_their_largest_and_middle() -> None:
    slos = Slos.parse("50ms,0.01s,25")
    assert slos.seconds == (0.05, 0.01, 0.025) and slos.ascending() == Slos((0.01, 0.025, 0.05))
    assert slos.largest == 0.05 and slos.middle == 0.01 and slos and not Slos()
    with pytest.raises(UserError, match="--slo: cannot read 'soon'"):
        Slos.parse("25ms,soon")
