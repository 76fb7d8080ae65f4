"""The K-quant types gguf-py cannot quantize (Q2_K ... Q6_K): blocks of random bytes written to a GGUF file, read back
through tfgen's reader, against values computed here straight from the block layouts of ggml's format (256 values
per block, in sub-blocks with their own scales)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf_files import finish

from tfgen.gguf.files import open_gguf
from tfgen.gguf.tensors import dequantize


def _half(raw: np.ndarray, offset: int) -> float:
    return float(raw[offset:offset + 2].view(np.float16)[0])


def _scale_min_k4(scales: np.ndarray, index: int) -> tuple[int, int]:
    """Q4_K / Q5_K: sub-block `index`'s 6-bit scale and min, packed in 12 bytes (4 full bytes + 2 high bits each)."""
    if index < 4:
        return int(scales[index] & 63), int(scales[index + 4] & 63)
    scale = (scales[index + 4] & 0xF) | ((scales[index - 4] >> 6) << 4)
    minimum = (scales[index + 4] >> 4) | ((scales[index] >> 6) << 4)
    return int(scale), int(minimum)


def _q4_k(raw):  # d, dmin (f16), scales[12], qs[128]: 8 sub-blocks of 32, low nibbles then high nibbles
    d, dmin, scales, qs = _half(raw, 0), _half(raw, 2), raw[4:16], raw[16:144]
    values = []
    for chunk in range(4):
        quants = qs[32 * chunk: 32 * chunk + 32]
        for sub, nibbles in ((2 * chunk, quants & 0xF), (2 * chunk + 1, quants >> 4)):
            scale, minimum = _scale_min_k4(scales, sub)
            values += [d * scale * int(q) - dmin * minimum for q in nibbles]
    return values


def _q5_k(raw):  # d, dmin, scales[12], qh[32], qs[128]: as Q4_K with a fifth bit per value from qh
    d, dmin, scales, qh, qs = _half(raw, 0), _half(raw, 2), raw[4:16], raw[16:48], raw[48:176]
    values = []
    for chunk in range(4):
        quants = qs[32 * chunk: 32 * chunk + 32]
        for half, nibbles in ((0, quants & 0xF), (1, quants >> 4)):
            sub = 2 * chunk + half
            scale, minimum = _scale_min_k4(scales, sub)
            high = (qh >> sub) & 1
            values += [d * scale * (int(q) + 16 * int(h)) - dmin * minimum for q, h in zip(nibbles, high)]
    return values


def _q6_k(raw):  # ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16] (one per 16 values), d
    ql, qh, scales, d = raw[0:128], raw[128:192], raw[192:208].view(np.int8), _half(raw, 208)
    values = np.zeros(256)
    for half in range(2):
        low, high, scale = ql[64 * half: 64 * half + 64], qh[32 * half: 32 * half + 32], scales[8 * half:]
        for lane in range(32):
            quarters = (
                (low[lane] & 0xF) | ((high[lane] & 3) << 4),
                (low[lane + 32] & 0xF) | (((high[lane] >> 2) & 3) << 4),
                (low[lane] >> 4) | (((high[lane] >> 4) & 3) << 4),
                (low[lane + 32] >> 4) | (((high[lane] >> 6) & 3) << 4),
            )
            for quarter, q in enumerate(quarters):
                values[128 * half + 32 * quarter + lane] = d * scale[lane // 16 + 2 * quarter] * (int(q) - 32)
    return list(values)


def _q2_k(raw):  # scales[16] (4-bit scale, 4-bit min per 16 values), qs[64] (2 bits each), d, dmin
    scales, qs, d, dmin = raw[0:16], raw[16:80], _half(raw, 80), _half(raw, 82)
    values, sub = [], 0
    for half in range(2):
        quants = qs[32 * half: 32 * half + 32]
        for shift in (0, 2, 4, 6):
            for part in (quants[:16], quants[16:]):
                scale, minimum = scales[sub] & 0xF, scales[sub] >> 4
                values += [d * int(scale) * int((q >> shift) & 3) - dmin * int(minimum) for q in part]
                sub += 1
    return values


def _q3_k(raw):  # hmask[32] (third bit), qs[64] (2 bits), scales[12] (16 6-bit scales, offset 32), d
    hmask, qs, packed, d = raw[0:32], raw[32:96], raw[96:108], _half(raw, 108)
    low_bits = [int(packed[i % 8] & 0xF) if i < 8 else int(packed[i % 8] >> 4) for i in range(16)]
    scales = [low_bits[i] | ((int(packed[8 + i % 4]) >> (2 * (i // 4))) & 3) << 4 for i in range(16)]
    values, sub, bit = [], 0, 0
    for half in range(2):
        quants = qs[32 * half: 32 * half + 32]
        for shift in (0, 2, 4, 6):
            for offset in (0, 16):
                for lane in range(16):
                    q = (int(quants[offset + lane]) >> shift) & 3
                    high_set = (hmask[offset + lane] >> bit) & 1
                    values.append(d * (scales[sub] - 32) * (q - (0 if high_set else 4)))
                sub += 1
            bit += 1
    return values


# type -> (block bytes, byte offsets of its float16 scales, reference).
K_QUANTS = {
    "Q4_K": (144, (0, 2), _q4_k),
    "Q5_K": (176, (0, 2), _q5_k),
    "Q6_K": (210, (208,), _q6_k),
    "Q2_K": (84, (80, 82), _q2_k),
    "Q3_K": (110, (108,), _q3_k),
}


@pytest.mark.parametrize("type_name", sorted(K_QUANTS))
def test_k_quant_blocks_dequantize_per_the_format(tmp_path, type_name):
    block_bytes, half_offsets, reference = K_QUANTS[type_name]
    rng = np.random.default_rng(7)
    rows, blocks = 3, 2
    raw = rng.integers(0, 256, size=(rows, blocks, block_bytes), dtype=np.uint8)
    for offset in half_offsets:  # finite, moderate super-block scales
        raw[:, :, offset:offset + 2] = rng.uniform(0.01, 0.5, size=(rows, blocks, 1)).astype(np.float16).view(np.uint8)
    writer = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    writer.add_tensor("blocks", raw.reshape(rows, blocks * block_bytes), raw_dtype=gguf.GGMLQuantizationType[type_name])
    finish(writer)
    values = dequantize(open_gguf(tmp_path / "k.gguf"), "blocks")
    assert values.shape == (rows, blocks * 256) and values.dtype == np.float32
    expected = np.array([[value for block in row for value in reference(block)] for row in raw], np.float32)
    np.testing.assert_allclose(values, expected, rtol=1e-6, atol=1e-6)
