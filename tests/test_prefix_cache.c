/* test_prefix_cache.c — the block-level prefix cache of engine/kvcache.c: the hash
 * chain, reference counts, LRU eviction (cached blocks given up before a request would
 * wait), sharing by several sequences including one preempted, and the rule that the
 * last token is always left to compute. */
#include <stdlib.h>
#include <string.h>
#include "engine/kvcache.h"
#include "test.h"

enum { BS = 4 };

static kv_hash salt_of(uint64_t x) { return (kv_hash){x, ~x}; }

/* A sequence that computed n tokens: reserve, then commit its full blocks. */
static void compute(kvcache *kv, kvcache_table *t, const int32_t *tok, int n) {
    if (kvcache_reserve(kv, t, n) != 0) return;
    kvcache_commit_full(kv, t, tok, n);
}

TEST(prefix_hash_chain) {
    int32_t a[2 * BS] = {1, 2, 3, 4, 5, 6, 7, 8}, b[2 * BS] = {9, 2, 3, 4, 5, 6, 7, 8};
    kv_hash s = salt_of(1);
    kv_hash a0 = kvcache_chain(s, a, BS), a1 = kvcache_chain(a0, a + BS, BS);
    kv_hash b0 = kvcache_chain(s, b, BS), b1 = kvcache_chain(b0, b + BS, BS);
    /* deterministic */
    kv_hash a1again = kvcache_chain(kvcache_chain(s, a, BS), a + BS, BS);
    CHECK(a1.lo == a1again.lo && a1.hi == a1again.hi);
    /* same second block after a different first block: a different name */
    CHECK(a1.lo != b1.lo || a1.hi != b1.hi);
    CHECK(a0.lo != b0.lo);
    /* the salt (model, KV dtype, block size) changes every name */
    kv_hash c0 = kvcache_chain(salt_of(2), a, BS);
    CHECK(c0.lo != a0.lo || c0.hi != a0.hi);
}

TEST(prefix_share_refcount_and_last_token_rule) {
    kvcache kv;
    llmi_status st = {0};
    CHECK(kvcache_init(&kv, 16, BS, true, salt_of(7), &st) == 0);
    int32_t tok[3 * BS];
    for (int i = 0; i < 3 * BS; i++) tok[i] = 100 + i;
    kvcache_table a = {0}, b = {0}, c = {0}, d = {0};
    compute(&kv, &a, tok, 3 * BS);                 /* 3 full blocks cached */
    CHECK(a.n_hashed == 3 && kvcache_used(&kv) == 3);
    /* same 12 tokens: only 2 blocks may be reused, the last token must be computed */
    CHECK(kvcache_match_prefix(&kv, &b, tok, 3 * BS) == 2 * BS);
    CHECK(b.n_blocks == 2 && b.blocks[0] == a.blocks[0] && b.blocks[1] == a.blocks[1]);
    CHECK(kv.ref[a.blocks[0]] == 2 && kv.ref[a.blocks[2]] == 1);
    /* 13 tokens: all 3 full blocks reused, token 13 computed */
    int32_t longer[3 * BS + 1];
    memcpy(longer, tok, sizeof tok);
    longer[3 * BS] = 5;
    CHECK(kvcache_match_prefix(&kv, &c, longer, 3 * BS + 1) == 3 * BS);
    CHECK(kv.ref[a.blocks[2]] == 2 && kv.ref[a.blocks[0]] == 3);
    /* a prompt shorter than one block + 1 reuses nothing */
    CHECK(kvcache_match_prefix(&kv, &d, tok, BS) == 0 && d.n_blocks == 0);
    /* a different token in block 1 stops the match after block 0 */
    int32_t other[3 * BS + 1];
    memcpy(other, longer, sizeof other);
    other[BS + 2] = 1;
    CHECK(kvcache_match_prefix(&kv, &d, other, 3 * BS + 1) == BS);
    CHECK(kvcache_used(&kv) == 3);
    kvcache_release(&kv, &a);
    kvcache_release(&kv, &b);
    kvcache_release(&kv, &c);
    kvcache_release(&kv, &d);
    /* nobody holds them: cached, evictable, not used; all 16 still available */
    CHECK(kvcache_used(&kv) == 0 && kv.n_evictable == 3 && kvcache_available(&kv) == 16);
    kvcache_table_free(&a), kvcache_table_free(&b), kvcache_table_free(&c), kvcache_table_free(&d);
    kvcache_free(&kv);
}

TEST(prefix_eviction_lru_before_waiting) {
    kvcache kv;
    llmi_status st = {0};
    CHECK(kvcache_init(&kv, 6, BS, true, salt_of(3), &st) == 0);
    int32_t p[3][2 * BS];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 2 * BS; i++) p[s][i] = 1000 * (s + 1) + i;
    kvcache_table t[3] = {{0}};
    for (int s = 0; s < 3; s++) compute(&kv, &t[s], p[s], 2 * BS);   /* 6 blocks, all cached */
    CHECK(kvcache_available(&kv) == 0);
    int first_released[3][2];
    for (int s = 0; s < 3; s++) {
        first_released[s][0] = t[s].blocks[0];
        first_released[s][1] = t[s].blocks[1];
        kvcache_release(&kv, &t[s]);   /* order of release: 0, 1, 2 */
    }
    CHECK(kv.n_evictable == 6 && kvcache_available(&kv) == 6);
    /* A new sequence needing 2 blocks evicts the least recently released ones: sequence 0's,
     * its last block first. */
    kvcache_table n = {0};
    CHECK(kvcache_reserve(&kv, &n, 2 * BS) == 0);
    CHECK(n.blocks[0] == first_released[0][1] && n.blocks[1] == first_released[0][0]);
    CHECK(kv.n_evicted == 2);
    /* sequence 0's prefix is gone, sequence 1's is still there */
    kvcache_table m0 = {0}, m1 = {0};
    int32_t q0[2 * BS + 1], q1[2 * BS + 1];
    memcpy(q0, p[0], sizeof p[0]), q0[2 * BS] = 1;
    memcpy(q1, p[1], sizeof p[1]), q1[2 * BS] = 1;
    CHECK(kvcache_match_prefix(&kv, &m0, q0, 2 * BS + 1) == 0);
    CHECK(kvcache_match_prefix(&kv, &m1, q1, 2 * BS + 1) == 2 * BS);
    /* caching never makes a reservation fail that fits the pool: of 6 blocks, n and m1
     * hold 4; sequence 2's 2 cached blocks are all there is, and they are given up */
    CHECK(kvcache_available(&kv) == 2);
    kvcache_table big = {0};
    CHECK(kvcache_reserve(&kv, &big, 3 * BS) == -1);
    CHECK(kvcache_reserve(&kv, &big, 2 * BS) == 0);
    CHECK(kvcache_used(&kv) == 6);
    kvcache_release(&kv, &n), kvcache_release(&kv, &m1), kvcache_release(&kv, &big);
    kvcache_table_free(&n), kvcache_table_free(&m0), kvcache_table_free(&m1), kvcache_table_free(&big);
    for (int s = 0; s < 3; s++) kvcache_table_free(&t[s]);
    kvcache_free(&kv);
}

TEST(prefix_block_shared_by_three_one_preempted) {
    kvcache kv;
    llmi_status st = {0};
    CHECK(kvcache_init(&kv, 12, BS, true, salt_of(11), &st) == 0);
    int32_t sys[2 * BS + 3];
    for (int i = 0; i < 2 * BS + 3; i++) sys[i] = 7 * i + 1;
    kvcache_table s[3] = {{0}};
    compute(&kv, &s[0], sys, 2 * BS + 1);               /* the first computes the shared prefix */
    for (int k = 1; k < 3; k++) {
        CHECK(kvcache_match_prefix(&kv, &s[k], sys, 2 * BS + 3) == 2 * BS);
        CHECK(kvcache_reserve(&kv, &s[k], 2 * BS + 3) == 0);   /* its own partial third block */
    }
    int shared = s[0].blocks[0];
    CHECK(kv.ref[shared] == 3 && s[1].blocks[0] == shared && s[2].blocks[0] == shared);
    CHECK(s[1].blocks[2] != s[2].blocks[2]);            /* partial blocks are never shared */
    /* preempt sequence 1: its references go, the shared blocks stay for the others */
    kvcache_release(&kv, &s[1]);
    CHECK(kv.ref[shared] == 2 && kv.cached[shared]);
    /* on re-admission it finds the prefix again */
    CHECK(kvcache_match_prefix(&kv, &s[1], sys, 2 * BS + 3) == 2 * BS && kv.ref[shared] == 3);
    for (int k = 0; k < 3; k++) kvcache_release(&kv, &s[k]);
    CHECK(kvcache_used(&kv) == 0 && kv.ref[shared] == 0 && kv.cached[shared]);
    /* with caching off nothing is matched or kept */
    kvcache off;
    CHECK(kvcache_init(&off, 12, BS, false, salt_of(11), &st) == 0);
    kvcache_table o = {0}, o2 = {0};
    compute(&off, &o, sys, 2 * BS + 1);
    kvcache_release(&off, &o);
    CHECK(kvcache_match_prefix(&off, &o2, sys, 2 * BS + 3) == 0 && off.n_free == 12);
    for (int k = 0; k < 3; k++) kvcache_table_free(&s[k]);
    kvcache_table_free(&o), kvcache_table_free(&o2);
    kvcache_free(&kv);
    kvcache_free(&off);
}

/* Random churn: every block is either free, evictable or referenced, reference counts
 * equal the tables' holdings, and every cached block is findable by its hash. */
TEST(prefix_random_churn_invariants) {
    unsigned long long seed = test_seed();
    kvcache kv;
    llmi_status st = {0};
    CHECK(kvcache_init(&kv, 40, BS, true, salt_of(5), &st) == 0);
    enum { NS = 6 };
    kvcache_table t[NS] = {{0}};
    int32_t toks[NS][8 * BS];
    for (int iter = 0; iter < 3000; iter++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int s = (int)((seed >> 33) % NS), op = (int)((seed >> 45) % 3);
        if (op == 0 || t[s].n_blocks == 0) {
            kvcache_release(&kv, &t[s]);
            /* prompts drawn from a small alphabet of prefixes so they share */
            int fam = (int)((seed >> 20) % 3), n = 1 + (int)((seed >> 25) % (8 * BS));
            for (int i = 0; i < n; i++) toks[s][i] = fam * 100 + (i < 2 * BS ? i : (int)((seed >> (i % 40)) & 7));
            int got = kvcache_match_prefix(&kv, &t[s], toks[s], n);
            CHECK(got % BS == 0 && got <= n - 1);
            if (kvcache_reserve(&kv, &t[s], n) == 0) kvcache_commit_full(&kv, &t[s], toks[s], n);
            else kvcache_release(&kv, &t[s]);
        } else {
            kvcache_release(&kv, &t[s]);
        }
        int refs[40] = {0};
        for (int k = 0; k < NS; k++)
            for (int i = 0; i < t[k].n_blocks; i++) refs[t[k].blocks[i]]++;
        int held = 0;
        for (int b = 0; b < 40; b++) {
            CHECK(refs[b] == kv.ref[b]);
            held += refs[b] > 0;
            if (kv.cached[b]) CHECK(kvcache_lookup(&kv, kv.hash[b], kv.tokens + b * BS) == b);
        }
        CHECK(held == kvcache_used(&kv) && held + kv.n_free + kv.n_evictable == 40);
    }
    for (int k = 0; k < NS; k++) kvcache_release(&kv, &t[k]), kvcache_table_free(&t[k]);
    kvcache_free(&kv);
}
