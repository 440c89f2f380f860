"""The block-hash root names its (model, cache salt, adapter) tuple unambiguously (issue 28, finding 3).

The root used to join the fields with NUL, and a client's ``cache_salt`` may hold NUL, so a
base-model request salted ``"\\0lora\\0ad"`` hashed like an unsalted request for adapter ``ad``.
"""

from hypothesis import given
from hypothesis import strategies as st

from radix.hashing import block_hashes, root_hash

# Characters a client can send, weighted towards the ones a separator-based root would confuse.
_TRICKY = st.sampled_from(["\x00", ":", "|", "\\", "lora", "ad", "\ud800", "é", "\x00lora\x00"])
_TEXT = st.lists(st.one_of(_TRICKY, st.text(max_size=3)), max_size=5).map("".join)
_FIELD = st.one_of(st.none(), _TEXT)


def _key(model: str, salt: str | None, adapter: str | None) -> tuple[str, str | None, str | None]:
    """The tuple a root stands for: an empty salt or adapter means none (as the engine treats it)."""
    return model, salt or None, adapter or None


@given(_TEXT, _FIELD, _FIELD, _TEXT, _FIELD, _FIELD)
def test_distinct_tuples_never_share_a_root(
    model_a: str, salt_a: str | None, adapter_a: str | None, model_b: str, salt_b: str | None, adapter_b: str | None
) -> None:
    same_tuple = _key(model_a, salt_a, adapter_a) == _key(model_b, salt_b, adapter_b)
    same_root = root_hash(model_a, salt_a, adapter_a) == root_hash(model_b, salt_b, adapter_b)
    assert same_root == same_tuple


def test_a_salt_that_spells_an_adapter_is_not_that_adapter() -> None:
    """The reported reproduction and its variants: salts that spell the old separator layout."""
    model = "smollm2-135m"
    assert root_hash(model, "\x00lora\x00ad") != root_hash(model, None, "ad")
    assert root_hash(model, "tenant\x00lora\x00ad") != root_hash(model, "tenant", "ad")
    assert root_hash(model, "x", "ad") != root_hash(model, "x\x00lora\x00ad")
    assert root_hash(model + "\x00x") != root_hash(model, "x")
    tokens = list(range(64))
    assert set(block_hashes(tokens, 16, model, "\x00lora\x00ad")).isdisjoint(
        block_hashes(tokens, 16, model, None, "ad")
    )
