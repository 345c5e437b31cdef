/* quant_awq.h — owns AWQ's scale search and clipping search (quant_awq.c). */
#ifndef LLMI_QUANT_AWQ_H
#define LLMI_QUANT_AWQ_H

#include "quant/quant.h"

/* s (cols) = max(x_mean^alpha, 1e-4) normalised by sqrt(max s * min s): one grid point. */
void quant_awq_scales(const float *x_mean, int cols, float alpha, float *s);
/* Searches alpha in {0, 1/n_grid, ..} for the linears ws[i] (rows[i], cols) sharing one
 * input with per-channel mean |x| x_mean (cols) and Gram matrix h (cols, cols).
 * best_s (cols) receives the scales that multiply the weights' columns. */
int quant_awq_search_scale(float *const *ws, const int *rows, int n_lin, int cols, const float *x_mean,
                           const float *h, int group_size, int n_grid, float *best_s, double *best_loss,
                           llmi_status *st);
/* Clips w (rows, cols) in place per (row, group) to the max_val = amax*(1 - i/20),
 * i < n_shrink, that minimises the output error through h (cols, cols): the search, then
 * the clip. */
int quant_awq_clip(float *w, int rows, int cols, const float *h, int group_size, int n_shrink, llmi_status *st);
/* hb (cols / gs, gs, gs) = the diagonal (gs, gs) blocks of h (cols, cols): all of H the
 * clipping search reads. */
void quant_awq_h_blocks(const float *h, int cols, int gs, float *hb);
/* The search alone, on H's diagonal blocks hb (quant_awq_h_blocks): best_mv (rows, cols /
 * group_size) gets each (row, group)'s max_val (the first of equal losses; amax when every
 * candidate's loss is NaN).  Twin of llmi_cuda_awq_clip_search. */
void quant_awq_clip_search(const float *w, int rows, int cols, const float *hb, int group_size, int n_shrink,
                           float *best_mv);
/* w (rows, cols) clipped in place to +-best_mv of each (row, group). */
void quant_awq_clip_apply(float *w, int rows, int cols, int group_size, const float *best_mv);

#endif
