"""How far the router's predicted cached tokens are from what the backends report."""

from dataclasses import dataclass


@dataclass(frozen=True)
class CalibrationStats:
    count: int
    exact_fraction: float
    """Share of requests whose predicted cached tokens equal the reported ones."""
    mean_abs_error_tokens: float
    mean_error_tokens: float


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

    def summary(self) -> CalibrationStats:
        count = max(self.count, 1)
        return CalibrationStats(
            count=self.count,
            exact_fraction=self.exact / count if self.count else 0.0,
            mean_abs_error_tokens=self.abs_error_sum / count,
            mean_error_tokens=self.error_sum / count,
        )
