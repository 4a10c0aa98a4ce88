"""The composable update-transform chain: parity with fedray.wire.compression, chain-level error
feedback, exact bytes, pass-through, determinism, config errors and stage order."""

import math

import numpy as np
import pytest

from fedray.wire.compression import (
    powersgd_compress,
    powersgd_decompress,
    topk_compress,
    topk_decompress,
)
from fedray.wire.payload import Payload
from fedray.wire.transforms import (
    BF16,
    TRANSFORMS,
    PowerSGD,
    Quantize,
    TopK,
    TransformChain,
    parse_transforms,
)

SHAPES = {"conv": (8, 3, 3, 3), "fc": (300, 250), "bias": (7,)}  # fc: 75,000 > 65,536


def updates(seed, rounds, shapes=SHAPES):
    g = np.random.default_rng(seed)
    return [{k: g.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
            for _ in range(rounds)]


def same_arrays(a, b):
    """Same keys in the same order, dtypes, shapes and bytes."""
    assert list(a) == list(b)
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.dtype == y.dtype and x.shape == y.shape, k
        assert x.tobytes() == y.tobytes(), k


def wire(upload):
    p = Payload.encode(upload, "fp32")
    return p.header + b"".join(b.tobytes() for b in p.buffers)


# ------------------------------------------------------------- 1. parity with compression.py


def test_topk_chain_bit_identical_to_topk_compress():
    chain = TransformChain([TopK(0.1)])
    mem, err = None, None
    for r, u in enumerate(updates(0, 3)):
        up, mem, metrics = chain.client(u, SHAPES, mem, seed=1, round=r, client=4)
        ref = topk_compress(u, err, 0.1)
        err = ref.error
        same_arrays(up, ref.upload)
        same_arrays(mem["error"], ref.error)
        same_arrays(chain.server(up, SHAPES), topk_decompress(ref.upload, SHAPES))
        k = sum(v.size for n, v in ref.upload.items() if n.endswith(".values"))
        assert metrics == {"sent_values": k, "sent_indices": k, "sent_quantized": 0}
    assert up["fc.indices"].dtype == np.uint32 and up["conv.indices"].dtype == np.uint16


def test_powersgd_chain_bit_identical_to_powersgd_compress_with_warm_start():
    chain = TransformChain([PowerSGD(2)])
    mem, err, q = None, None, None
    for r, u in enumerate(updates(1, 3)):
        up, mem, _ = chain.client(u, SHAPES, mem, seed=3, round=r, client=5)
        ref = powersgd_compress(u, err, 2, q, seed=3, round=r, client=5)
        err, q = ref.error, ref.q_memory
        same_arrays(up, ref.upload)
        same_arrays(mem["error"], ref.error)
        same_arrays(mem["stages"]["0.powersgd"], ref.q_memory)
        same_arrays(chain.server(up, SHAPES), powersgd_decompress(ref.upload, SHAPES))
    assert set(up) == {"conv.P", "conv.Q", "fc.P", "fc.Q", "bias"}  # the vector goes dense


# ------------------------------------------------------------ 2. chain-level error feedback


@pytest.mark.parametrize("specs", [["topk", "int8"], [{"name": "powersgd", "rank": 1}, "int4"],
                                   [{"name": "topk", "density": 0.3}, "bf16"]])
def test_error_feedback_telescopes_over_the_whole_chain(specs):
    chain = TransformChain(parse_transforms(specs))
    us = updates(2, 6)
    sent = {k: np.zeros(s) for k, s in SHAPES.items()}
    mem = None
    for r, u in enumerate(us):
        up, mem, _ = chain.client(u, SHAPES, mem, seed=0, round=r, client=2)
        for k, v in chain.server(Payload.encode(up, "fp32").decode(), SHAPES).items():
            sent[k] += v
    for k in SHAPES:
        total = sum(u[k].astype(np.float64) for u in us)
        assert np.abs(mem["error"][k]).max() > 1e-3  # something really was held back
        np.testing.assert_allclose(total - sent[k], mem["error"][k],
                                   rtol=0, atol=1e-5 * np.abs(total).max())


def test_without_error_feedback_nothing_is_remembered_and_loss_is_not_fed_back():
    u = updates(3, 1)[0]
    plain = TransformChain([TopK(0.1), Quantize(4)], error_feedback=False)
    fed = TransformChain([TopK(0.1), Quantize(4)])
    up, mem, _ = plain.client(u, SHAPES, None, seed=0, round=0, client=0)
    assert "error" not in mem
    _, mem2, _ = fed.client(u, SHAPES, None, seed=0, round=0, client=0)
    # error covers the int4 loss on the kept entries too, not only the dropped ones
    kept = plain.server(up, SHAPES)["conv"] != 0
    assert np.abs(mem2["error"]["conv"][kept]).max() > 0


# ------------------------------------------------------------------------- 3. exact bytes


def _topk_bytes(code):
    """Body bytes of a top-k (density 0.25) upload of SHAPES followed by ``code``."""
    ks = {"conv": 54, "fc": 18750, "bias": 2}  # ceil(0.25 * size)
    idx = {"conv": 2, "fc": 4, "bias": 2}  # uint16 up to 65,536 entries, else uint32
    return sum(k * idx[n] + code(k) for n, k in ks.items())


def _psgd_int4_bytes():
    # conv 8x27 -> P 8x2, Q 27x2; fc 300x250 -> P 300x2, Q 250x2; bias dense 7
    return sum(math.ceil(n / 2) + 8 for n in (16, 54, 600, 500, 7))


BYTES = [
    (["topk"], lambda: _topk_bytes(lambda k: 4 * k)),
    (["topk", "int8"], lambda: _topk_bytes(lambda k: k + 8)),
    (["topk", "int4"], lambda: _topk_bytes(lambda k: math.ceil(k / 2) + 8)),
    (["powersgd", "int4"], _psgd_int4_bytes),
    (["bf16"], lambda: 2 * (216 + 75000 + 7)),
]


@pytest.mark.parametrize("specs,body", BYTES, ids=["+".join(s) for s, _ in BYTES])
def test_payload_bytes_are_exact(specs, body):
    specs = [{"name": "topk", "density": 0.25} if s == "topk" else s for s in specs]
    chain = TransformChain(parse_transforms(specs))
    u = {**updates(4, 1)[0], "orders.norm": np.float32([2.5])}
    up, _, metrics = chain.client(u, SHAPES, None, seed=0, round=0, client=0)
    p = Payload.encode(up, "fp32")
    assert p.nbytes == len(p.header) + body() + 4  # + the pass-through float32 scalar
    # metrics split the same upload into floats, integers and codes
    assert (4 * metrics["sent_values"] + sum(a.nbytes for a in up.values() if a.dtype.kind in "iu")
            == p.nbytes - len(p.header))
    # what the server gets from the wire is what the client's upload stands for
    same_arrays(chain.server(p.decode(), SHAPES), chain.server(up, SHAPES))


# ------------------------------------------------------------------------- 4. pass-through


def test_pass_through_keys_integers_and_absent_names():
    chain = TransformChain(parse_transforms([{"name": "topk", "density": 0.5}, "int8"]))
    u = updates(5, 1, {"w": (4, 6)})[0]
    extra = {"orders.norm": np.float32([1.5]), "counts": np.arange(6, dtype=np.int32).reshape(2, 3),
             "ids": np.array([3, 1], dtype=np.int64)}
    shapes = {"w": (4, 6), "counts": (2, 3), "head": (5, 2)}  # integer in shapes; head unsent
    up, mem, _ = chain.client({**u, **extra}, shapes, None, seed=0, round=0, client=0)
    for k, v in extra.items():
        assert up[k] is v  # untouched, not even copied
    assert not any(k.startswith("head") for k in up) and set(mem["error"]) == {"w"}
    dense = chain.server(Payload.encode(up, "fp32").decode(), shapes)
    assert set(dense) == {"w", *extra}
    for k, v in extra.items():
        same_arrays({k: dense[k]}, {k: v})
    assert dense["w"].shape == (4, 6)
    # a stage never overwrites a pass-through key that happens to look like its output
    with pytest.raises(ValueError, match="'w.values' it emits is already in the upload"):
        chain.client({**u, "w.values": np.float32([0])}, shapes, None, seed=0, round=0, client=0)


def test_empty_chain_is_identity_and_input_is_not_modified():
    u = updates(6, 1)[0]
    up, mem, _ = TransformChain([]).client(u, SHAPES, {"error": {"fc": u["fc"]}}, seed=0,
                                          round=0, client=0)
    same_arrays(up, u)
    assert mem == {}
    same_arrays(TransformChain([]).server(up, SHAPES), u)
    before = {k: v.copy() for k, v in u.items()}
    TransformChain(parse_transforms(["powersgd", "int8"])).client(u, SHAPES, None, seed=0,
                                                                 round=0, client=0)
    same_arrays(u, before)


def test_tensors_not_sent_this_round_keep_their_error_and_warm_start():
    chain = TransformChain(parse_transforms(["powersgd"]))
    u = updates(9, 2)
    _, mem, _ = chain.client(u[0], SHAPES, None, seed=0, round=0, client=0)
    frozen = {k: v for k, v in u[1].items() if k != "fc"}  # fc not trained/sent in round 1
    up, mem2, _ = chain.client(frozen, SHAPES, mem, seed=0, round=1, client=0)
    assert not any(k.startswith("fc") for k in up)
    assert mem2["error"]["fc"] is mem["error"]["fc"]
    assert mem2["stages"]["0.powersgd"]["fc"] is mem["stages"]["0.powersgd"]["fc"]
    assert mem2["stages"]["0.powersgd"]["conv"] is not mem["stages"]["0.powersgd"]["conv"]


# ------------------------------------------------------------------------- 5. determinism


def test_same_seed_round_client_give_same_bytes_and_clients_differ():
    chain = TransformChain(parse_transforms(["powersgd", "int4"]))
    u = updates(7, 1)[0]
    a = chain.client(u, SHAPES, None, seed=9, round=2, client=3)[0]
    b = chain.client(u, SHAPES, None, seed=9, round=2, client=3)[0]
    c = chain.client(u, SHAPES, None, seed=9, round=2, client=4)[0]
    assert wire(a) == wire(b)
    assert wire(a) != wire(c)
    p_a = TransformChain([PowerSGD(2)]).client(u, SHAPES, None, seed=9, round=2, client=3)[0]
    p_c = TransformChain([PowerSGD(2)]).client(u, SHAPES, None, seed=9, round=2, client=4)[0]
    assert not np.array_equal(p_a["fc.P"], p_c["fc.P"])  # a per-client initial Q


# ---------------------------------------------------------------------- 6. parse errors


@pytest.mark.parametrize("specs,needles", [
    (["topk", "top-k"], ["transforms[1]", "'top-k'", "allowed", "powersgd"]),
    ([{"name": "topk", "density": 0}], ["transforms[0]", "density=0", "(0, 1]"]),
    (["int8", {"name": "topk", "density": 1.5}], ["transforms[1]", "density=1.5", "(0, 1]"]),
    ([{"name": "powersgd", "rank": 0}], ["transforms[0]", "rank=0", ">= 1"]),
    ([{"name": "quantize", "bits": 3}], ["transforms[0]", "bits=3", "8 or 4"]),
    ([{"name": "topk", "rank": 2}], ["transforms[0]", "'rank'", "density"]),
    ([{"density": 0.1}], ["transforms[0]", "'name'"]),
])
def test_parse_transforms_errors_name_entry_value_and_allowed(specs, needles):
    with pytest.raises(ValueError) as e:
        parse_transforms(specs)
    msg = str(e.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_parse_transforms_builds_configured_stages():
    got = parse_transforms(["topk", {"name": "topk", "density": 0.1}, "int4",
                            {"name": "quantize", "bits": 8}, {"name": "powersgd", "rank": 4},
                            "bf16"])
    assert got == [TopK(0.01), TopK(0.1), Quantize(4), Quantize(8), PowerSGD(4), BF16()]
    assert [t.name for t in got] == ["topk", "topk", "int4", "int8", "powersgd", "bf16"]
    assert set(TRANSFORMS) >= {"topk", "powersgd", "int8", "int4", "bf16"}


# ------------------------------------------------------------------------ 7. stage order


def test_chain_order_is_honoured():
    u = updates(8, 1)[0]
    sparse_q = TransformChain(parse_transforms([{"name": "topk", "density": 0.1}, "int8"]))
    q_sparse = TransformChain(parse_transforms(["int8", {"name": "topk", "density": 0.1}]))
    up1, _, _ = sparse_q.client(u, SHAPES, None, seed=0, round=0, client=0)
    up2, _, _ = q_sparse.client(u, SHAPES, None, seed=0, round=0, client=0)
    assert "fc.indices" in up1 and "fc.values.q" in up1
    assert "fc.q" in up2 and not any(k.endswith(".indices") for k in up2)  # codes: not float
    assert wire(up1) != wire(up2)
    d1, d2 = sparse_q.server(up1, SHAPES), q_sparse.server(up2, SHAPES)
    for k, s in SHAPES.items():
        assert d1[k].shape == d2[k].shape == s
        assert np.count_nonzero(d1[k]) <= math.ceil(0.1 * np.prod(s))
        step = (u[k].max() - u[k].min()) / 255
        assert np.abs(d2[k] - u[k]).max() <= step / 2 * 1.001  # dense, within half a step


def test_transform_parameters_are_listed_and_plugins_register():
    from fedray.core.config import keys
    from fedray.wire.transforms import BF16, TRANSFORMS, register_transform

    rows = {k.key: k for k in keys() if k.key.startswith("payload.transforms[].")}
    assert rows["payload.transforms[].density"].applies_to == ["topk"]
    assert rows["payload.transforms[].density"].default == 0.01
    assert rows["payload.transforms[].bits"].applies_to == ["quantize"]
    assert register_transform("bf16", TRANSFORMS["bf16"]) is BF16  # the same is no clash
    with pytest.raises(TypeError, match="taken"):
        register_transform("bf16", lambda: BF16())
