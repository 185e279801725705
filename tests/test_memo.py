"""The small memo of answers about content-named git objects."""

from bmad_loop.caches import Memo


def test_a_memo_forgets_its_least_recently_used_entry_beyond_its_size():
    memo = Memo(2)
    memo.put("a", 1)
    memo.put("b", None)  # None is an answer ("no folder there"), not a miss
    assert memo.get("a") == 1  # "a" is now the most recent
    memo.put("c", 3)
    missing = object()
    assert memo.get("b", missing) is missing
    assert memo.get("a") == 1 and memo.get("c") == 3
    assert memo.get("nothing") is None
