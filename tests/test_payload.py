import json

import numpy as np
import pytest

from fedray.wire.payload import Payload


def tensors(seed=0):
    g = np.random.default_rng(seed)
    return {"w": g.normal(size=(33, 7)).astype(np.float32),
            "b": g.normal(size=(7,)).astype(np.float32),
            "s": np.array(3.5, dtype=np.float32)}


def header_len(t, codec):
    entries = [[k, list(np.shape(v))] for k, v in t.items()]
    return len(json.dumps({"codec": codec, "tensors": entries}, separators=(",", ":")).encode())


@pytest.mark.parametrize("codec,per_value,extra", [
    ("fp32", 4.0, 0), ("bf16", 2.0, 0), ("int8", 1.0, 8), ("int4", 0.5, 8)])
def test_exact_bytes(codec, per_value, extra):
    t = tensors()
    p = Payload.encode(t, codec)
    values = 0
    for v in t.values():
        values += int(np.ceil(v.size * per_value)) + extra
    assert p.nbytes == header_len(t, codec) + values


def test_fp32_roundtrip_is_exact():
    t = tensors()
    d = Payload.encode(t, "fp32").decode()
    for k in t:
        assert np.array_equal(d[k], t[k])


@pytest.mark.parametrize("codec,bits", [("int8", 8), ("int4", 4)])
def test_quantization_error_within_half_step(codec, bits):
    t = tensors(1)
    d = Payload.encode(t, codec).decode()
    for k, v in t.items():
        step = (v.max() - v.min()) / (2 ** bits - 1) if v.size > 1 else 0.0
        assert np.abs(d[k] - v).max() <= step / 2 + 1e-6
        assert d[k].shape == v.shape


def test_bf16_relative_error():
    t = tensors(2)
    d = Payload.encode(t, "bf16").decode()
    for k, v in t.items():
        assert np.all(np.abs(d[k] - v) <= np.abs(v) * 2 ** -8 + 1e-30)


@pytest.mark.parametrize("codec", ["fp32", "bf16", "int8", "int4"])
def test_nonfinite_detected(codec):
    t = tensors()
    assert Payload.encode(t, codec).all_finite()
    t["w"][3, 2] = np.nan
    assert not Payload.encode(t, codec).all_finite()
    t = tensors()
    t["b"][0] = np.inf
    assert not Payload.encode(t, codec).all_finite()


def test_unknown_codec():
    with pytest.raises(ValueError, match="int4"):
        Payload.encode(tensors(), "int3")


@pytest.mark.parametrize("codec", ["fp32", "bf16", "int8", "int4"])
def test_integer_tensors_travel_exactly_at_their_width(codec):
    idx = np.array([0, 7, 65535, 3], dtype=np.uint16)
    big = np.array([2**31 + 5], dtype=np.uint32)
    t = {"v": np.array([1.5, -2.0], np.float32), "i": idx, "j": big}
    p = Payload.encode(t, codec)
    d = p.decode()
    assert d["i"].dtype == np.uint16 and np.array_equal(d["i"], idx)
    assert np.array_equal(d["j"], big) and p.all_finite()
    value_bytes = {"fp32": 8, "bf16": 4, "int8": 2 + 8, "int4": 1 + 8}[codec]
    assert p.nbytes == len(p.header) + value_bytes + idx.nbytes + big.nbytes


def test_codecs_register_like_the_other_plugins_and_the_config_takes_them():
    from fedray.core.config import ConfigError, load_config
    from fedray.wire.payload import CODECS, Codec, register_codec

    assert list(CODECS) == ["fp32", "bf16", "int8", "int4"]
    half = Codec("fp16", 1, lambda x: (np.asarray(x, np.float16).reshape(-1),),
                 lambda b, size: b[0].astype(np.float32), lambda b: b[0], broadcast=True)
    register_codec(half)
    try:
        w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
        p = Payload.encode({"w": w, "i": np.arange(3)}, "fp16")
        assert p.nbytes == len(p.header) + 12 * 2 + 3 * 8
        back = p.decode()
        assert np.allclose(back["w"], w, atol=1e-3) and back["i"].tolist() == [0, 1, 2]
        cfg = load_config(None, ["payload.upload=fp16", "payload.download=fp16"])
        assert cfg.payload.upload == "fp16"
        with pytest.raises(TypeError, match="taken"):
            register_codec(Codec("fp16", 1, half.encode, half.decode, half.values))
    finally:
        del CODECS["fp16"]
    with pytest.raises(ConfigError, match="payload.download.*'fp32', 'bf16'"):
        load_config(None, ["payload.download=int8"])  # a lossy code is no broadcast codec
