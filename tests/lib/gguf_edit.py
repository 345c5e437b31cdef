"""Reads and rewrites GGUF v3 files with the standard library only (CI has no gguf package),
so tests can make broken variants of a valid file: a key changed or dropped, a tensor
renamed, dropped or given other bytes.  Layout as ggml's docs/gguf.md gives it.

    g = gguf_edit.read(path)       # {"kv": [[key, type, value_bytes]], "tensors": [...]}
    gguf_edit.set_str(g, "general.type", "model")
    g["tensors"][0]["name"] = "token_embd.weight.lora_a"
    gguf_edit.write(path, g)

A tensor is {"name", "dims" (ggml order, fastest first), "type" (ggml id), "data" (bytes)}.
"""
import struct

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY, F32 = 8, 9, 6


def _value_len(buf, pos, vtype):
    """Bytes of one value of vtype at pos."""
    if vtype in _SCALAR:
        return _SCALAR[vtype]
    if vtype == STRING:
        return 8 + struct.unpack_from("<Q", buf, pos)[0]
    if vtype == ARRAY:
        etype, n = struct.unpack_from("<IQ", buf, pos)
        end = pos + 12
        for _ in range(n):
            end += _value_len(buf, end, etype)
        return end - pos
    raise ValueError(f"value type {vtype}")


def _string(buf, pos):
    n = struct.unpack_from("<Q", buf, pos)[0]
    return buf[pos + 8:pos + 8 + n].decode(), pos + 8 + n


def read(path):
    buf = open(path, "rb").read()
    assert buf[:4] == b"GGUF", path
    _, n_t, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos, kv, infos = 24, [], []
    for _ in range(n_kv):
        key, pos = _string(buf, pos)
        vtype = struct.unpack_from("<I", buf, pos)[0]
        n = _value_len(buf, pos + 4, vtype)
        kv.append([key, vtype, buf[pos + 4:pos + 4 + n]])
        pos += 4 + n
    for _ in range(n_t):
        name, pos = _string(buf, pos)
        nd = struct.unpack_from("<I", buf, pos)[0]
        dims = list(struct.unpack_from(f"<{nd}Q", buf, pos + 4))
        ttype, off = struct.unpack_from("<IQ", buf, pos + 4 + 8 * nd)
        pos += 4 + 8 * nd + 12
        infos.append((name, dims, ttype, off))
    align = 32
    for key, vtype, val in kv:
        if key == "general.alignment":
            align = struct.unpack("<I", val)[0]
    start = (pos + align - 1) // align * align
    ends = sorted([o for *_, o in infos] + [len(buf) - start])
    tensors = []
    for name, dims, ttype, off in infos:
        end = next(e for e in ends if e > off)   # up to the next tensor (padding included)
        tensors.append({"name": name, "dims": dims, "type": ttype, "data": buf[start + off:start + end]})
    return {"kv": kv, "tensors": tensors, "alignment": align}


def set_str(g, key, value):
    raw = struct.pack("<Q", len(value.encode())) + value.encode()
    for e in g["kv"]:
        if e[0] == key:
            e[1], e[2] = STRING, raw
            return
    g["kv"].append([key, STRING, raw])


def set_f32(g, key, value):
    for e in g["kv"]:
        if e[0] == key:
            e[1], e[2] = F32, struct.pack("<f", value)
            return
    g["kv"].append([key, F32, struct.pack("<f", value)])


def drop_key(g, key):
    g["kv"] = [e for e in g["kv"] if e[0] != key]


def find(g, name):
    return next(t for t in g["tensors"] if t["name"] == name)


def write(path, g):
    align = g.get("alignment", 32)
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(g["tensors"]), len(g["kv"])))
    for key, vtype, val in g["kv"]:
        out += struct.pack("<Q", len(key.encode())) + key.encode() + struct.pack("<I", vtype) + val
    data, offs = bytearray(), []
    for t in g["tensors"]:
        data += b"\0" * (-len(data) % align)
        offs.append(len(data))
        data += t["data"]
    for t, off in zip(g["tensors"], offs):
        out += struct.pack("<Q", len(t["name"].encode())) + t["name"].encode()
        out += struct.pack("<I", len(t["dims"])) + struct.pack(f"<{len(t['dims'])}Q", *t["dims"])
        out += struct.pack("<IQ", t["type"], off)
    out += b"\0" * (-len(out) % align)
    open(path, "wb").write(bytes(out + data))
