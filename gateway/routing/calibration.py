"""How far the router's predicted cached tokens are from what the backends report."""

from dataclasses import dataclass


@dataclass
class Calibration:
    count: int = 0
    exact: int = 0
    abs_error_sum: int = 0
    error_sum: int = 0
    """Predicted minus reported, summed: positive means the router is optimistic."""

    def add(self, predicted: int, reported: int) -> None:
        error = predicted - reported
        self.count += 1
        self.exact += error == 0
        self.abs_error_sum += abs(error)
        self.error_sum += error

    def summary(self) -> dict[str, float | int]:
        count = max(self.count, 1)
        return {
            "count": self.count,
            "exact_fraction": self.exact / count if self.count else 0.0,
            "mean_abs_error_tokens": self.abs_error_sum / count,
            "mean_error_tokens": self.error_sum / count,
        }
