import subprocess
import sys

import pytest

from pdmesh.kv.block_hash import BlockHasher, extra_keys_for


def test_chain_depends_on_every_previous_block() -> None:
    h = BlockHasher(block_size=4, seed=7)
    a = h.hash_tokens([1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = h.hash_tokens([0, 2, 3, 4, 5, 6, 7, 8])
    assert len(a) == 2  # the trailing partial block is not hashed
    assert a[0] != b[0] and a[1] != b[1]  # same second block, different parent
    assert h.hash_tokens([1, 2, 3, 4, 5, 6, 7, 8]) == a


def test_continuing_a_chain_equals_hashing_at_once() -> None:
    h = BlockHasher(block_size=4)
    tokens = list(range(20))
    full = h.hash_tokens(tokens)
    head = h.hash_tokens(tokens[:8])
    assert head + h.hash_tokens(tokens, parent=head[-1], start=8) == full


def test_seed_algorithm_and_extra_keys_change_hashes() -> None:
    tokens = list(range(8))
    base = BlockHasher(4, seed=0).hash_tokens(tokens)
    assert BlockHasher(4, seed=1).hash_tokens(tokens) != base
    assert BlockHasher(4, algorithm="sha256").hash_tokens(tokens) != base
    assert len(BlockHasher(4, algorithm="sha256").hash_tokens(tokens)[0]) == 32
    salted = BlockHasher(4).hash_tokens(tokens, extra_keys_for(cache_salt="tenant-a"))
    assert salted != base
    assert salted != BlockHasher(4).hash_tokens(tokens, extra_keys_for(cache_salt="tenant-b"))


def test_invalid_configuration_is_rejected() -> None:
    with pytest.raises(ValueError, match="block_size"):
        BlockHasher(0)
    with pytest.raises(ValueError, match="unknown hash algorithm"):
        BlockHasher(4, algorithm="md5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="multiple of block_size"):
        BlockHasher(4).hash_tokens(list(range(8)), start=2)


def test_two_processes_compute_identical_hashes() -> None:
    code = (
        "from pdmesh.kv.block_hash import BlockHasher, extra_keys_for;"
        "h = BlockHasher(16, seed=42);"
        "print(','.join(x.hex() for x in h.hash_tokens(list(range(100, 164)), extra_keys_for('s'))))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={"PYTHONHASHSEED": str(seed), "PATH": ""},
        ).stdout.strip()
        for seed in (1, 2)
    }
    here = BlockHasher(16, seed=42).hash_tokens(list(range(100, 164)), extra_keys_for("s"))
    assert outs == {",".join(x.hex() for x in here)}


def test_hashing_does_not_import_torch() -> None:
    code = "import sys, pdmesh.kv.block_hash; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
