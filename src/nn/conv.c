/*
 * conv.c — conv2d (im2col + one OpenBLAS sgemm per sample) and maxpool2d of ddp/nn.h.
 *
 * conv2d works one sample at a time so that its scratch is one im2col matrix (in_ch·kh·kw,
 * out_h·out_w), however large the batch; a batched im2col would make fewer, larger sgemms but
 * need B times the memory and a transpose of the output. The backward rebuilds the im2col matrix
 * rather than keeping the forward's: memory over time, the usual trade for CPU training of small
 * networks. No dilation, groups or asymmetric padding; no padding or ceil mode for the pool.
 */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "ddp/nn.h"
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
                    for (int ow = 0; ow < c->out_w; ow++) {
                        int iw = ow * c->stride - c->pad + j;
                        r[ow] = iw >= 0 && iw < c->w ? xc[(size_t)ih * c->w + iw] : 0.0f;
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
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c->out_ch, P, K, 1.0f, W, K, scratch,
                    P, 1.0f, yn, P);
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
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c->out_ch, K, P, 1.0f, dyn, P,
                        scratch, P, 1.0f, dW, K);
        }
        if (dx) { /* dcol (K, P) = Wᵀ (K, out_ch) · dy_n (out_ch, P), reusing the scratch */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, P, c->out_ch, 1.0f, W, K, dyn,
                        P, 0.0f, scratch, P);
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
                const float *r0 = xp + (size_t)(2 * oh) * p->w, *r1 = r0 + p->w;
                int base = 2 * oh * p->w;
                for (int ow = 0; ow < p->out_w; ow++) {
                    float v[4] = {r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]};
                    int off[4] = {0, 1, p->w, p->w + 1};
                    int b = 0;
                    for (int k = 1; k < 4; k++)
                        if (v[k] > v[b] || (isnan(v[k]) && !isnan(v[b])))
                            b = k;
                    yp[oh * p->out_w + ow] = v[b];
                    ap[oh * p->out_w + ow] = base + 2 * ow + off[b];
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
