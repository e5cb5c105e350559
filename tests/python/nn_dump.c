/*
 * nn_dump — runs one ddp/nn.h kernel or optimizer on inputs from files, for test_nn_torch.py to
 * compare with torch. Usage: nn_dump DIR OP N1 N2 … where OP and the numbers are
 *   linear    B IN OUT                   in: x W b dy dW db          out: y dx dW db
 *   conv2d    B CIN H W COUT KH KW S P   in: x W b dy dW db          out: y dx dW db
 *   maxpool   B C H W K S                in: x dy                    out: y dx
 *   batchnorm B C HW TRAIN MOMENTUM      in: x gamma beta rm rv dy   out: y dx dgamma dbeta rm rv
 *   gelu      N                          in: x dy                    out: y dx
 *   xent      B C SCALE                  in: logits labels (int32)   out: loss (1 float64)
 *                                                                          dlogits correct (int32)
 *   sgd       N STEPS LR MOMENTUM WD     in: p g (STEPS·N)           out: p buf
 *   adamw     N STEPS LR B1 B2 EPS WD    in: p g (STEPS·N)           out: p m v
 * Input NAME is read from DIR/NAME.bin, output NAME written to DIR/out_NAME.bin, raw
 * little-endian float32 unless noted. Parameter gradients dW, db, dgamma, dbeta start from the
 * input files' values and accumulate, so the accumulation is checked too.
 * A test tool: any error prints a line and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/nn.h"
#include "dump_io.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: nn_dump DIR OP ARGS…\n");
        return 1;
    }
    dump_init("nn_dump", argv[1]);
    const char *op = argv[2];
    double a[10] = {0};
    for (int i = 3; i < argc && i < 13; i++)
        a[i - 3] = atof(argv[i]);
    ddp_error err = {0};

    if (!strcmp(op, "linear")) {
        int B = (int)a[0], in = (int)a[1], out = (int)a[2];
        float *x = rdf("x", (size_t)B * in), *W = rdf("W", (size_t)out * in), *b = rdf("b", out);
        float *dy = rdf("dy", (size_t)B * out), *dW = rdf("dW", (size_t)out * in);
        float *db = rdf("db", out), *y = zalloc((size_t)B * out), *dx = zalloc((size_t)B * in);
        ddp_nn_linear_forward(x, W, b, B, in, out, y);
        ddp_nn_linear_backward(dy, x, W, B, in, out, dx, dW, db);
        wrf("y", y, (size_t)B * out), wrf("dx", dx, (size_t)B * in);
        wrf("dW", dW, (size_t)out * in), wrf("db", db, out);
    } else if (!strcmp(op, "conv2d")) {
        int B = (int)a[0];
        ddp_nn_conv2d c = {(int)a[1], (int)a[2], (int)a[3], (int)a[4], (int)a[5], (int)a[6],
                           (int)a[7], (int)a[8], 0,         0,         0};
        if (ddp_nn_conv2d_setup(&c, &err) != DDP_OK)
            die(err.msg, op);
        size_t nx = (size_t)B * c.in_ch * c.h * c.w, nw = (size_t)c.out_ch * c.in_ch * c.kh * c.kw;
        size_t ny = (size_t)B * c.out_ch * c.out_h * c.out_w;
        float *x = rdf("x", nx), *W = rdf("W", nw), *b = rdf("b", c.out_ch), *dy = rdf("dy", ny);
        float *dW = rdf("dW", nw), *db = rdf("db", c.out_ch), *y = zalloc(ny), *dx = zalloc(nx);
        float *scratch = zalloc(c.scratch_floats);
        ddp_nn_conv2d_forward(&c, x, W, b, B, scratch, y);
        ddp_nn_conv2d_backward(&c, dy, x, W, B, scratch, dx, dW, db);
        wrf("y", y, ny), wrf("dx", dx, nx), wrf("dW", dW, nw), wrf("db", db, c.out_ch);
    } else if (!strcmp(op, "maxpool")) {
        int B = (int)a[0];
        ddp_nn_pool2d p = {(int)a[1], (int)a[2], (int)a[3], (int)a[4], (int)a[5], 0, 0};
        if (ddp_nn_maxpool2d_setup(&p, &err) != DDP_OK)
            die(err.msg, op);
        size_t nx = (size_t)B * p.ch * p.h * p.w, ny = (size_t)B * p.ch * p.out_h * p.out_w;
        float *x = rdf("x", nx), *dy = rdf("dy", ny), *y = zalloc(ny), *dx = zalloc(nx);
        int32_t *arg = track(calloc(ny ? ny : 1, sizeof(int32_t)));
        ddp_nn_maxpool2d_forward(&p, x, B, y, arg);
        ddp_nn_maxpool2d_backward(&p, dy, arg, B, dx);
        wrf("y", y, ny), wrf("dx", dx, nx);
    } else if (!strcmp(op, "batchnorm")) {
        int B = (int)a[0], C = (int)a[1], hw = (int)a[2];
        bool train = a[3] != 0;
        size_t n = (size_t)B * C * hw;
        float *x = rdf("x", n), *g = rdf("gamma", C), *bt = rdf("beta", C), *rm = rdf("rm", C);
        float *rv = rdf("rv", C), *dy = rdf("dy", n), *dg = rdf("dgamma", C);
        float *dbt = rdf("dbeta", C), *y = zalloc(n), *dx = zalloc(n), *sm = zalloc(C);
        float *si = zalloc(C);
        if (ddp_nn_batchnorm_forward(x, B, C, hw, g, bt, (float)a[4], 1e-5f, train, rm, rv, y, sm,
                                     si, &err) != DDP_OK)
            die(err.msg, op);
        ddp_nn_batchnorm_backward(dy, x, B, C, hw, g, sm, si, train, dx, dg, dbt);
        wrf("y", y, n), wrf("dx", dx, n), wrf("dgamma", dg, C), wrf("dbeta", dbt, C);
        wrf("rm", rm, C), wrf("rv", rv, C);
    } else if (!strcmp(op, "gelu")) {
        size_t n = (size_t)a[0];
        float *x = rdf("x", n), *dy = rdf("dy", n), *y = zalloc(n), *dx = zalloc(n);
        ddp_nn_gelu_forward(x, n, y);
        ddp_nn_gelu_backward(dy, x, n, dx);
        wrf("y", y, n), wrf("dx", dx, n);
    } else if (!strcmp(op, "xent")) {
        int B = (int)a[0], C = (int)a[1], correct = 0;
        float *l = rdf("logits", (size_t)B * C), *d = zalloc((size_t)B * C);
        int32_t *lab = rd("labels", B, sizeof(int32_t));
        double loss;
        if (ddp_nn_softmax_xent(l, lab, B, C, (float)a[2], &loss, d, &correct, &err) != DDP_OK)
            die(err.msg, op);
        wr("loss", &loss, 1, sizeof loss), wrf("dlogits", d, (size_t)B * C);
        wr("correct", &correct, 1, sizeof(int32_t));
    } else if (!strcmp(op, "sgd") || !strcmp(op, "adamw")) {
        bool adam = !strcmp(op, "adamw");
        size_t n = (size_t)a[0];
        int steps = (int)a[1];
        float *p = rdf("p", n), *g = rdf("g", (size_t)steps * n), *s1 = zalloc(n);
        float *s2 = zalloc(n);
        for (int s = 1; s <= steps; s++) {
            const float *gs = g + (size_t)(s - 1) * n;
            if (adam)
                ddp_nn_adamw_step(p, gs, s1, s2, n, (float)a[2], (float)a[3], (float)a[4],
                                  (float)a[5], (float)a[6], (uint64_t)s);
            else
                ddp_nn_sgd_step(p, gs, s1, n, (float)a[2], (float)a[3], (float)a[4], (uint64_t)s);
        }
        wrf("p", p, n);
        wrf(adam ? "m" : "buf", s1, n);
        if (adam)
            wrf("v", s2, n);
    } else {
        die("unknown op", op);
    }
    dump_free_all();
    return 0;
}
