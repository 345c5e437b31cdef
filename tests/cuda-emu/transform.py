"""transform.py KERNEL.cu OUT.cpp: a kernels/ source as C++ for the CPU emulation of CUDA
(tests/cuda-emu): each `k<<<grid, block[, smem[, stream]]>>>(args)` becomes
emu_launch_named("k", k, grid, block, smem, stream, args); each static `__shared__` variable a
reference to per-block storage (emu_static_smem, keyed by its place in the file); each
`extern __shared__` array a pointer to the launch's dynamic shared memory; the two inline
PTX instructions llmi uses (mma.sync m16n8k16, ldmatrix .x2.trans, .x4 and .x4.trans, cp.async 16-byte
copies, their groups and waits) calls of their emulations (include/emu_block.h).  Any other inline assembly stops the build."""
import re, sys
src = open(sys.argv[1]).read()
counter = [0]
def dyn(m):
    return f"{m.group(2)} *{m.group(3)} = ({m.group(2)} *)emu_dyn_smem();"
src = re.sub(r"extern __shared__ __align__\((\d+)\) ([\w ]+?) (\w+)\[\];", dyn, src)
src = re.sub(r"extern __shared__ ([\w ]+?) (\w+)\[\];", lambda m: f"{m.group(1)} *{m.group(2)} = ({m.group(1)} *)emu_dyn_smem();", src)
def stat(m):
    counter[0] += 1
    ty, name, dims = m.group(1).strip(), m.group(2), m.group(3) or ""
    i = counter[0]
    if dims:
        return f"auto &{name} = *reinterpret_cast<{ty}(*){dims}>(emu_static_smem({i}, sizeof({ty}{dims})));"
    return f"auto &{name} = *reinterpret_cast<{ty} *>(emu_static_smem({i}, sizeof({ty})));"
src, n_st = re.subn(r"__shared__ (?:__align__\(\d+\) )?([\w: ]+?) (\w+)((?:\[[^\]]+\])*);", stat, src)
def split_top(s):
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{": depth += 1
        if ch in ")]}": depth -= 1
        if ch == "," and depth == 0: out.append(cur); cur = ""
        else: cur += ch
    out.append(cur)
    return [x.strip() for x in out]
def launch(m):
    k, cfg, args = m.group(1), split_top(m.group(2)), m.group(3)
    while len(cfg) < 4: cfg.append("0")
    a = f", {args}" if args.strip() else ""
    return f'emu_launch_named("{k}", {k}, {cfg[0]}, {cfg[1]}, {cfg[2]}, {cfg[3]}{a});'
src, n_l = re.subn(r"([\w:]+(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\s*\((.*?)\);", launch, src, flags=re.S)
# only the exact instructions the emulations model: another shape, layout or operand binding
# must get its own emulation, not this one's
MMA = ('asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_T "." PTX_T ".f32 {%0,%1,%2,%3}, "'
       '"{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"'
       ': "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])'
       ': "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));')
LDSM = 'asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(b[0]), "=r"(b[1]) : "r"(addr));'
LDSMT = ('asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"'
         ': "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "r"(addr));')
def asm_stmt(kind, want, repl):
    def f(m):
        got = re.sub(r"\s|\\\n", "", m.group(0))
        assert got == re.sub(r"\s", "", want), f"{sys.argv[1]}: unmodelled {kind}: {m.group(0)}"
        return repl
    return f
src, n_m = re.subn(r'asm volatile\("mma\.sync.*?\);', asm_stmt("mma", MMA, "emu_mma_m16n8k16(PTX_T, d, a, b);"), src, flags=re.S)
src, n_d = re.subn(r'asm volatile\("ldmatrix\.sync\.aligned\.m8n8\.x2\.trans.*?\);', asm_stmt("ldmatrix", LDSM, "emu_ldsm_x2_trans(b, row);"), src, flags=re.S)
src, n_dt = re.subn(r'asm volatile\("ldmatrix\.sync\.aligned\.m8n8\.x4\.trans.*?\);', asm_stmt("ldmatrix.x4.trans", LDSMT, "emu_ldsm_x4_trans(b, row);"), src, flags=re.S)
n_d += n_dt
LDSM4 = ('asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"'
         ': "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));')
src, n_d4 = re.subn(r'asm volatile\("ldmatrix\.sync\.aligned\.m8n8\.x4.*?\);', asm_stmt("ldmatrix.x4", LDSM4, "emu_ldsm_x4(r, row);"), src, flags=re.S)
n_d += n_d4
CPA = 'asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(addr), "l"(src) : "memory");'
CPW = 'asm volatile("cp.async.wait_all;" ::: "memory");'
src, n_c = re.subn(r'asm volatile\("cp\.async\.cg.*?\);', asm_stmt("cp.async", CPA, "emu_cp_async16(dst, src);"), src, flags=re.S)
src, n_w = re.subn(r'asm volatile\("cp\.async\.wait_all.*?\);', asm_stmt("cp.async.wait_all", CPW, "emu_cp_async_wait_all();"), src, flags=re.S)
CPC = 'asm volatile("cp.async.commit_group;" ::: "memory");'
CPG = 'asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");'
src, n_cc = re.subn(r'asm volatile\("cp\.async\.commit_group.*?\);', asm_stmt("cp.async.commit_group", CPC, "emu_cp_async_commit();"), src, flags=re.S)
src, n_wg = re.subn(r'asm volatile\("cp\.async\.wait_group.*?\);', asm_stmt("cp.async.wait_group", CPG, "emu_cp_async_wait_group(N);"), src, flags=re.S)
n_w += n_cc + n_wg
assert 'asm' not in re.sub(r'#.*', '', src), "asm left in " + sys.argv[1]
sys.stderr.write(f"{sys.argv[1]}: static smem {n_st}, launches {n_l}, mma {n_m}, ldmatrix {n_d}, cp.async {n_c}+{n_w}\n")
open(sys.argv[2], "w").write(src)
