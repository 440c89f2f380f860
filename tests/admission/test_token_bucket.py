from gateway.admission.token_bucket import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_bucket_refills_at_its_rate_and_tells_how_long_to_wait() -> None:
    clock = Clock()
    bucket = TokenBucket(600, clock)
    assert bucket.try_take(600) == 0.0
    assert bucket.try_take(100) == 10.0
    clock.now = 10.0
    assert bucket.try_take(100) == 0.0


def test_unused_tokens_come_back_up_to_the_cap() -> None:
    clock = Clock()
    bucket = TokenBucket(60, clock)
    assert bucket.try_take(60) == 0.0
    bucket.give_back(1000)
    assert bucket.try_take(60) == 0.0
    assert bucket.try_take(1) > 0


def test_request_larger_than_the_budget_passes_on_a_full_bucket_only() -> None:
    clock = Clock()
    bucket = TokenBucket(60, clock)
    assert bucket.try_take(120) == 0.0
    assert bucket.try_take(1) > 60
