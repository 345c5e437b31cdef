#!/usr/bin/env python3
# quant-heldout-err.py STATS CKPT_DIR... — diagnostic for docs/QUANT.md ("Why GPTQ loses").
# Per-layer relative output error tr(D H D^T)/tr(W H W^T), D = W - Q, of GPTQ-v1 checkpoints
# under the Gram matrices of a stats file (diagnostic; reads the Q4_1 GGUF as the reference W).
# STATS: a --save-stats file; CKPT_DIR: GPTQ-v1 outputs of llmi quantize (v/o/gate/up/down only:
# q/k rows are permuted in the GGUF).  Needs numpy, safetensors, gguf-py and the zstd CLI.
import sys, numpy as np, gguf
from safetensors import safe_open
GG='/root/.cache/llmi/SmolLM2-135M-Instruct.Q4_1.gguf'
stats=sys.argv[1]; ckpts=sys.argv[2:]
r=gguf.GGUFReader(GG)
T={t.name:t for t in r.tensors}
def W(name):
    t=T[name]; a=gguf.dequantize(t.data, t.tensor_type)
    return np.asarray(a,dtype=np.float64).reshape(int(t.shape[1]), int(t.shape[0]))
def unpack(f,p):
    qw=f.get_tensor(p+'.qweight').view(np.uint32); qz=f.get_tensor(p+'.qzeros').view(np.uint32)
    sc=f.get_tensor(p+'.scales').astype(np.float64); gi=f.get_tensor(p+'.g_idx')
    cols=qw.shape[0]*8; rows=qw.shape[1]
    q=np.zeros((cols,rows),np.int64)
    for j in range(8): q[j::8,:]=(qw>>(4*j))&15
    z=np.zeros((qz.shape[0],rows),np.int64)
    for j in range(8): z[:,j::8]=(qz>>(4*j))&15
    z=z+1
    return ((q-z[gi,:])*sc[gi,:]).T  # (rows, cols)
def grams(path):
    import subprocess; raw=subprocess.run(['zstd','-d','-c',path],capture_output=True).stdout
    hdr=np.frombuffer(raw[8:28],np.uint32); L=int(hdr[0]); cols=[int(c) for c in hdr[1:]]
    off=28; out=[]
    for l in range(L):
        row=[]
        for k in range(4):
            n=cols[k]; off+=4*n
            t=np.frombuffer(raw[off:off+4*n*(n+1)//2],np.float32); off+=4*n*(n+1)//2
            H=np.zeros((n,n)); iu=np.triu_indices(n); H[iu]=t; H=H+H.T-np.diag(np.diag(H))
            row.append(H)
        out.append(row)
    return out
G=grams(stats)
fs=[safe_open(c+'/model.safetensors','np') for c in ckpts]
lin=[('self_attn.v_proj','attn_v',0),('self_attn.o_proj','attn_output',1),('mlp.gate_proj','ffn_gate',2),('mlp.up_proj','ffn_up',2),('mlp.down_proj','ffn_down',3)]
tot=np.zeros(len(ckpts)); 
for l in range(len(G)):
    line=[]
    for hf,gn,k in lin:
        w=W(f'blk.{l}.{gn}.weight'); H=G[l][k]; den=np.einsum('ij,jk,ik->',w,H,w)
        es=[]
        for i,f in enumerate(fs):
            d=w-unpack(f,f'model.layers.{l}.{hf}'); e=np.einsum('ij,jk,ik->',d,H,d)/den; es.append(e); tot[i]+=np.log(e)
        line.append(hf.split('.')[1][:4]+' '+' '.join(f'{e:.2e}' for e in es))
    print(l, ' | '.join(line), flush=True)
print('geo-mean ratio of errors (ckpt i / ckpt 0):', np.exp((tot-tot[0])/(len(G)*len(lin))))
