"""Trusted evaluator (protected): prints the metric as `score: <number>`."""

import solution

print(f"score: {solution.score():.6f}")
