"""The editable solution. Replace with your own code; X is a tunable knob."""

X = 3.0


def score() -> float:
    return (X - 1.25) ** 2
