/*
 * conv.c — conv2d (im2col + one OpenBLAS sgemm per sample) and maxpool2d of ddp/nn.h.
 *
 * conv2d works one sample at a time so that its scratch is one im2col matrix (in_ch·kh·kw,
 * out_h·out_w), however large the batch; a batched im2col would make fewer, larger sgemms but
 * need B times the memory and a transpose of the output. The backward rebuilds the im2col matrix
 * rather than keeping the forward's: memory over time, the usual trade for CPU training of small
 * networks. No dilation, groups or asymmetric padding; no padding or ceil mode for the pool.
 */
#include <limits.h>
#include <math.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "ddp/nn.h"
#include "kernels/kernels.h"
#include "util/util.h"

ddp_status ddp_nn_conv2d_setup(ddp_nn_conv2d *c, ddp_error *err)
{
    if (c->in_ch <= 0 || c->h <= 0 || c->w <= 0 || c->out_ch <= 0 || c->kh <= 0 || c->kw <= 0 ||
        c->stride <= 0 || c->pad < 0)
        return ddp__err(err, DDP_ERR_INVALID,
                        "conv2d geometry in_ch %d h %d w %d out_ch %d kernel %dx%d stride %d "
                        "pad %d: sizes and stride must be positive and padding not negative",
                        c->in_ch, c->h, c->w, c->out_ch, c->kh, c->kw, c->stride, c->pad);
    long long ph = (long long)c->h + 2LL * c->pad, pw = (long long)c->w + 2LL * c->pad;
    if (ph < c->kh || pw < c->kw)
        return ddp__err(err, DDP_ERR_INVALID,
                        "conv2d kernel %dx%d is larger than the padded input %lldx%lld; use a "
                        "smaller kernel or more padding",
                        c->kh, c->kw, ph, pw);
    long long oh = (ph - c->kh) / c->stride + 1, ow = (pw - c->kw) / c->stride + 1;
    long long k = (long long)c->in_ch * c->kh * c->kw, p = oh * ow;
    long long in_plane = (long long)c->h * c->w;
    /* sgemm takes int sizes and leading dimensions: K, P, out_ch, and one sample's input. */
    if (k > INT_MAX || p > INT_MAX || in_plane * c->in_ch > INT_MAX || p * c->out_ch > INT_MAX ||
        (unsigned long long)k * (unsigned long long)p > SIZE_MAX / 4)
        return ddp__err(err, DDP_ERR_INVALID,
                        "conv2d in_ch %d h %d w %d out_ch %d kernel %dx%d: one sample's matrices "
                        "exceed 2^31 elements",
                        c->in_ch, c->h, c->w, c->out_ch, c->kh, c->kw);
    c->out_h = (int)oh;
    c->out_w = (int)ow;
    c->scratch_floats = (size_t)k * (size_t)p;
    return DDP_OK;
}

/* col (K, P) with K = in_ch·kh·kw, P = out_h·out_w: col[(ci·kh + i)·kw + j][oh·out_w + ow] =
 * x[ci][oh·stride − pad + i][ow·stride − pad + j], 0 outside the input. x: one sample. */
static void im2col(const ddp_nn_conv2d *c, const float *x, float *col)
{
    int P = c->out_h * c->out_w;
    for (int ci = 0; ci < c->in_ch; ci++)
        for (int i = 0; i < c->kh; i++)
            for (int j = 0; j < c->kw; j++) {
                float *row = col + ((size_t)(ci * c->kh + i) * c->kw + j) * P;
                const float *xc = x + (size_t)ci * c->h * c->w;
                for (int oh = 0; oh < c->out_h; oh++) {
                    int ih = oh * c->stride - c->pad + i;
                    float *r = row + (size_t)oh * c->out_w;
                    if (ih < 0 || ih >= c->h) {
                        memset(r, 0, sizeof(float) * (size_t)c->out_w);
                        continue;
                    }
                    const float *src = xc + (size_t)ih * c->w;
                    if (c->stride == 1) { /* zeros, one contiguous copy, zeros */
                        int lo = c->pad - j, hi = c->w + c->pad - j; /* ow with 0 ≤ iw < w */
                        lo = lo < 0 ? 0 : lo > c->out_w ? c->out_w : lo;
                        hi = hi > c->out_w ? c->out_w : hi < lo ? lo : hi;
                        memset(r, 0, sizeof(float) * (size_t)lo);
                        memcpy(r + lo, src + lo - c->pad + j, sizeof(float) * (size_t)(hi - lo));
                        memset(r + hi, 0, sizeof(float) * (size_t)(c->out_w - hi));
                        continue;
                    }
                    for (int ow = 0; ow < c->out_w; ow++) {
                        int iw = ow * c->stride - c->pad + j;
                        r[ow] = iw >= 0 && iw < c->w ? src[iw] : 0.0f;
                    }
                }
            }
}

/* The adjoint of im2col: dx (one sample, in_ch, h, w) = 0, then += every col entry at the input
 * position it was copied from. */
static void col2im(const ddp_nn_conv2d *c, const float *col, float *dx)
{
    int P = c->out_h * c->out_w;
    memset(dx, 0, sizeof(float) * (size_t)c->in_ch * c->h * c->w);
    for (int ci = 0; ci < c->in_ch; ci++)
        for (int i = 0; i < c->kh; i++)
            for (int j = 0; j < c->kw; j++) {
                const float *row = col + ((size_t)(ci * c->kh + i) * c->kw + j) * P;
                float *dxc = dx + (size_t)ci * c->h * c->w;
                for (int oh = 0; oh < c->out_h; oh++) {
                    int ih = oh * c->stride - c->pad + i;
                    if (ih < 0 || ih >= c->h)
                        continue;
                    const float *r = row + (size_t)oh * c->out_w;
                    for (int ow = 0; ow < c->out_w; ow++) {
                        int iw = ow * c->stride - c->pad + j;
                        if (iw >= 0 && iw < c->w)
                            dxc[(size_t)ih * c->w + iw] += r[ow];
                    }
                }
            }
}

void ddp_nn_conv2d_forward(const ddp_nn_conv2d *c, const float *x, const float *W, const float *b,
                           int B, float *scratch, float *y)
{
    int K = c->in_ch * c->kh * c->kw, P = c->out_h * c->out_w;
    size_t xs = (size_t)c->in_ch * c->h * c->w, ys = (size_t)c->out_ch * P;
    for (int n = 0; n < B; n++) {
        float *yn = y + (size_t)n * ys;
        for (int o = 0; o < c->out_ch; o++) /* y starts as the bias */
            for (int q = 0; q < P; q++)
                yn[(size_t)o * P + q] = b ? b[o] : 0.0f;
        im2col(c, x + (size_t)n * xs, scratch);
        /* y_n (out_ch, P) += W (out_ch, K) · col (K, P) */
        ddp__sgemm(false, false, c->out_ch, P, K, 1.0f, W, K, scratch, P, 1.0f, yn, P);
    }
}

void ddp_nn_conv2d_backward(const ddp_nn_conv2d *c, const float *dy, const float *x, const float *W,
                            int B, float *scratch, float *dx, float *dW, float *db)
{
    int K = c->in_ch * c->kh * c->kw, P = c->out_h * c->out_w;
    size_t xs = (size_t)c->in_ch * c->h * c->w, ys = (size_t)c->out_ch * P;
    for (int n = 0; n < B; n++) {
        const float *dyn = dy + (size_t)n * ys;
        if (db)
            for (int o = 0; o < c->out_ch; o++) {
                double s = 0.0;
                for (int q = 0; q < P; q++)
                    s += dyn[(size_t)o * P + q];
                db[o] += (float)s;
            }
        if (dW) { /* dW (out_ch, K) += dy_n (out_ch, P) · colᵀ (P, K) */
            im2col(c, x + (size_t)n * xs, scratch);
            ddp__sgemm(false, true, c->out_ch, K, P, 1.0f, dyn, P, scratch, P, 1.0f, dW, K);
        }
        if (dx) { /* dcol (K, P) = Wᵀ (K, out_ch) · dy_n (out_ch, P), reusing the scratch */
            ddp__sgemm(true, false, K, P, c->out_ch, 1.0f, W, K, dyn, P, 0.0f, scratch, P);
            col2im(c, scratch, dx + (size_t)n * xs);
        }
    }
}

/* ---- maxpool2d ------------------------------------------------------------------------------- */

ddp_status ddp_nn_maxpool2d_setup(ddp_nn_pool2d *p, ddp_error *err)
{
    if (p->ch <= 0 || p->h <= 0 || p->w <= 0 || p->kernel <= 0 || p->stride <= 0 ||
        p->kernel > p->h || p->kernel > p->w)
        return ddp__err(err, DDP_ERR_INVALID,
                        "maxpool2d geometry ch %d h %d w %d kernel %d stride %d: sizes must be "
                        "positive and the kernel no larger than the input",
                        p->ch, p->h, p->w, p->kernel, p->stride);
    if ((long long)p->ch * p->h * p->w > INT_MAX)
        return ddp__err(err, DDP_ERR_INVALID,
                        "maxpool2d input ch %d h %d w %d exceeds 2^31 elements per sample", p->ch,
                        p->h, p->w);
    p->out_h = (p->h - p->kernel) / p->stride + 1;
    p->out_w = (p->w - p->kernel) / p->stride + 1;
    return DDP_OK;
}

#ifdef __SSE2__
/* 2×2 / stride 2 max-pool of one output row, four outputs at a time (GCC does not vectorise the
 * scalar loop: the NaN rule and the stride-2 loads defeat it). The same rule as the scalar
 * loop, lane by lane. Returns how many outputs it did (a multiple of 4). */
static int pool2_sse(const float *r0, const float *r1, float *y, int32_t *argmax, int OW, int W,
                     int base)
{
    int ow = 0;
    const __m128i i1 = _mm_set1_epi32(1), iw = _mm_set1_epi32(W), iw1 = _mm_set1_epi32(W + 1);
    for (; ow + 4 <= OW; ow += 4) {
        __m128 a0 = _mm_loadu_ps(r0 + 2 * ow), a1 = _mm_loadu_ps(r0 + 2 * ow + 4);
        __m128 b0 = _mm_loadu_ps(r1 + 2 * ow), b1 = _mm_loadu_ps(r1 + 2 * ow + 4);
        __m128 x[3] = {_mm_shuffle_ps(a0, a1, _MM_SHUFFLE(3, 1, 3, 1)),
                       _mm_shuffle_ps(b0, b1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm_shuffle_ps(b0, b1, _MM_SHUFFLE(3, 1, 3, 1))};
        const __m128i idx[3] = {i1, iw, iw1};
        __m128 m = _mm_shuffle_ps(a0, a1, _MM_SHUFFLE(2, 0, 2, 0));
        __m128i at = _mm_setzero_si128();
        for (int k = 0; k < 3; k++) {
            __m128 v = x[k];
            __m128 t = _mm_or_ps(_mm_cmpgt_ps(v, m),
                                 _mm_and_ps(_mm_cmpunord_ps(v, v), _mm_cmpord_ps(m, m)));
            m = _mm_or_ps(_mm_and_ps(t, v), _mm_andnot_ps(t, m));
            __m128i ti = _mm_castps_si128(t);
            at = _mm_or_si128(_mm_and_si128(ti, idx[k]), _mm_andnot_si128(ti, at));
        }
        __m128i pos = _mm_add_epi32(_mm_set1_epi32(base + 2 * ow), _mm_set_epi32(6, 4, 2, 0));
        _mm_storeu_ps(y + ow, m);
        _mm_storeu_si128((__m128i *)(argmax + ow), _mm_add_epi32(pos, at));
    }
    return ow;
}
#endif

void ddp_nn_maxpool2d_forward(const ddp_nn_pool2d *p, const float *x, int B, float *y,
                              int32_t *argmax)
{
    size_t planes = (size_t)(B > 0 ? B : 0) * (size_t)p->ch;
    size_t in_plane = (size_t)p->h * p->w, out_plane = (size_t)p->out_h * p->out_w;
    if (p->kernel == 2 && p->stride == 2) {
        /* The common case, without the general loop's bookkeeping; the same rule (the first
         * maximum in row-major window order wins; a NaN takes over). */
        for (size_t pl = 0; pl < planes; pl++) {
            const float *xp = x + pl * in_plane;
            float *yp = y + pl * out_plane;
            int32_t *ap = argmax + pl * out_plane;
            for (int oh = 0; oh < p->out_h; oh++) {
                const float *restrict r0 = xp + (size_t)(2 * oh) * p->w, *restrict r1 = r0 + p->w;
                float *restrict yr = yp + (size_t)oh * p->out_w;
                int32_t *restrict ar = ap + (size_t)oh * p->out_w;
                const int W = p->w, OW = p->out_w, base = 2 * oh * p->w; /* hoisted: the
                    argmax stores could alias *p as far as the compiler knows */
                int ow = 0;
#ifdef __SSE2__
                ow = pool2_sse(r0, r1, yr, ar, OW, W, base);
#endif
                for (; ow < OW; ow++) {
                    /* A candidate takes over when it is larger, or a NaN over a number. */
                    float m = r0[2 * ow], v;
                    int at = 0;
                    v = r0[2 * ow + 1];
                    if (v > m || (isnan(v) && !isnan(m)))
                        m = v, at = 1;
                    v = r1[2 * ow];
                    if (v > m || (isnan(v) && !isnan(m)))
                        m = v, at = W;
                    v = r1[2 * ow + 1];
                    if (v > m || (isnan(v) && !isnan(m)))
                        m = v, at = W + 1;
                    yr[ow] = m;
                    ar[ow] = base + 2 * ow + at;
                }
            }
        }
        return;
    }
    for (size_t pl = 0; pl < planes; pl++) {
        const float *xp = x + pl * in_plane;
        for (int oh = 0; oh < p->out_h; oh++)
            for (int ow = 0; ow < p->out_w; ow++) {
                int h0 = oh * p->stride, w0 = ow * p->stride;
                int best = h0 * p->w + w0;
                float mx = xp[best];
                for (int i = 0; i < p->kernel; i++)
                    for (int j = 0; j < p->kernel; j++) {
                        int at = (h0 + i) * p->w + w0 + j;
                        /* torch's rule: a strictly larger value or a NaN takes over. */
                        if (xp[at] > mx || (isnan(xp[at]) && !isnan(mx)))
                            mx = xp[at], best = at;
                    }
                size_t o = pl * out_plane + (size_t)oh * p->out_w + ow;
                y[o] = mx;
                argmax[o] = best;
            }
    }
}

void ddp_nn_maxpool2d_backward(const ddp_nn_pool2d *p, const float *dy, const int32_t *argmax,
                               int B, float *dx)
{
    size_t planes = (size_t)(B > 0 ? B : 0) * (size_t)p->ch;
    size_t in_plane = (size_t)p->h * p->w, out_plane = (size_t)p->out_h * p->out_w;
    if (planes == 0)
        return;
    memset(dx, 0, sizeof(float) * planes * in_plane);
    for (size_t pl = 0; pl < planes; pl++)
        for (size_t o = 0; o < out_plane; o++)
            dx[pl * in_plane + (size_t)argmax[pl * out_plane + o]] += dy[pl * out_plane + o];
}
