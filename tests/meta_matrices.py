"""Hand-written RAVEN ``meta_matrix`` labels for tests (importable: tests/ is on the path)."""
from __future__ import annotations

import numpy as np

from rpm_lib import rules


def meta_matrix(rows: dict[int, tuple[str, tuple[str, ...]]]) -> np.ndarray:
    """(8, 9) meta_matrix with one (relation, attributes) per given row (row = 4 * component + rule group)."""
    m = np.zeros((8, 9), dtype=np.uint8)
    for row, (relation, attributes) in rows.items():
        m[row, rules.RELATIONS.index(relation)] = 1
        for a in attributes:
            m[row, 4 + rules.ATTRIBUTES.index(a)] = 1
    return m


#: center_single: Constant Number/Position, Progression Type, Arithmetic Size, Distribute_Three Color.
CENTER = meta_matrix({0: ("Constant", ("Number", "Position")), 1: ("Progression", ("Type",)),
                      2: ("Arithmetic", ("Size",)), 3: ("Distribute_Three", ("Color",))})
#: Left-Right: everything Constant except Progression on Type in the right component.
LEFT_RIGHT = meta_matrix({0: ("Constant", ("Number", "Position")), 1: ("Constant", ("Type",)),
                          2: ("Constant", ("Size",)), 3: ("Constant", ("Color",)),
                          4: ("Constant", ("Number", "Position")), 5: ("Progression", ("Type",)),
                          6: ("Constant", ("Size",)), 7: ("Constant", ("Color",))})
