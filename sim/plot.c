/*
 * plot.c -- PNG plots with gnuplot: for `tandem ab`, the TTFT and TPOT distributions
 * (empirical CDFs) and the throughput of each config; for `tandem sweep`, throughput
 * against p99 TPOT with the Pareto frontier. The data go to a temporary directory next to
 * the PNG, the script is piped to gnuplot, and the temporary files are removed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int write_cdf(const char *path, double *v, size_t n)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    qsort(v, n, sizeof *v, cmp_d);
    /* at most ~2000 points per curve */
    size_t stride = n > 2000 ? n / 2000 : 1;
    for (size_t i = 0; i < n; i += stride) fprintf(f, "%.6g %.6g\n", v[i], (double)(i + 1) / n);
    if (n) fprintf(f, "%.6g 1\n", v[n - 1]);
    return fclose(f);
}

static int have_gnuplot(void) { return system("command -v gnuplot >/dev/null 2>&1") == 0; }

static int run_gnuplot(const char *script, char *err, size_t errlen)
{
    FILE *g = popen("gnuplot 2>&1", "w");
    if (!g) {
        snprintf(err, errlen, "cannot run gnuplot");
        return -1;
    }
    fputs(script, g);
    int rc = pclose(g);
    if (rc != 0) {
        snprintf(err, errlen, "gnuplot failed (status %d)", rc);
        return -1;
    }
    return 0;
}

static void sanitize(char *dst, size_t n, const char *s)
{
    size_t k = 0;
    for (; *s && k + 1 < n; s++) dst[k++] = (*s == '"' || *s == '\\' || *s == '_') ? '-' : *s;
    dst[k] = '\0';
}

int tdm_sim_plot_ab(const char *png, const tdm_sim_result *const *rs, size_t n, char *err,
                    size_t errlen)
{
    if (!have_gnuplot()) {
        snprintf(err, errlen, "gnuplot not found (install it: scripts/bootstrap)");
        return -1;
    }
    char dir[] = "/tmp/tandem-plot-XXXXXX";
    if (!mkdtemp(dir)) {
        snprintf(err, errlen, "cannot create a temporary directory");
        return -1;
    }
    size_t maxn = 1;
    for (size_t j = 0; j < n; j++) maxn = rs[j]->n > maxn ? rs[j]->n : maxn;
    double *v = malloc(maxn * sizeof *v);
    size_t cap = 8192 + n * 1024;
    char *sc = malloc(cap);
    int rc = -1;
    if (!v || !sc) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    char path[512];
    for (size_t j = 0; j < n; j++) {
        size_t k = 0;
        for (size_t i = 0; i < rs[j]->n; i++)
            if (rs[j]->reqs[i].first_token >= 0)
                v[k++] = (rs[j]->reqs[i].first_token - rs[j]->reqs[i].arrival) * 1e3;
        snprintf(path, sizeof path, "%s/ttft%zu.dat", dir, j);
        if (write_cdf(path, v, k) != 0) goto io;
        k = 0;
        for (size_t i = 0; i < rs[j]->n; i++) {
            double tp = tdm_sim_req_tpot(&rs[j]->reqs[i]);
            if (tp >= 0) v[k++] = tp * 1e3;
        }
        snprintf(path, sizeof path, "%s/tpot%zu.dat", dir, j);
        if (write_cdf(path, v, k) != 0) goto io;
    }
    snprintf(path, sizeof path, "%s/thr.dat", dir);
    FILE *f = fopen(path, "w");
    if (!f) goto io;
    for (size_t j = 0; j < n; j++) {
        char nm[64];
        sanitize(nm, sizeof nm, rs[j]->name);
        fprintf(f, "%zu \"%s\" %.6g %.6g\n", j, nm, rs[j]->sum.request_throughput,
                rs[j]->sum.output_throughput_tok_s);
    }
    fclose(f);
    size_t w = 0;
    w += (size_t)snprintf(sc + w, cap - w,
                          "set terminal pngcairo size 1500,480 font ',10'\nset output '%s'\n"
                          "set multiplot layout 1,3\nset grid\nset key bottom right\n"
                          "set logscale x\nset title 'TTFT CDF'\nset xlabel 'TTFT (ms)'\n"
                          "set ylabel 'fraction of requests'\nset yrange [0:1]\nplot ",
                          png);
    for (size_t j = 0; j < n; j++) {
        char nm[64];
        sanitize(nm, sizeof nm, rs[j]->name);
        w += (size_t)snprintf(sc + w, cap - w, "%s'%s/ttft%zu.dat' u 1:2 w l lw 2 t \"%s\"",
                              j ? ", " : "", dir, j, nm);
    }
    w += (size_t)snprintf(sc + w, cap - w,
                          "\nset title 'TPOT CDF'\nset xlabel 'TPOT (ms)'\nunset logscale x\nplot ");
    for (size_t j = 0; j < n; j++) {
        char nm[64];
        sanitize(nm, sizeof nm, rs[j]->name);
        w += (size_t)snprintf(sc + w, cap - w, "%s'%s/tpot%zu.dat' u 1:2 w l lw 2 t \"%s\"",
                              j ? ", " : "", dir, j, nm);
    }
    snprintf(sc + w, cap - w,
             "\nset title 'throughput'\nset xlabel ''\nset ylabel 'output tokens/s'\n"
             "set autoscale y\nset yrange [0:*]\nset style fill solid 0.6\nset boxwidth 0.6\n"
             "unset key\nset xrange [-0.7:%zu.7]\n"
             "plot '%s/thr.dat' u 1:4:xtic(2) w boxes, '' u 1:4:(sprintf('%%.0f', $4)) "
             "w labels offset 0,1\nunset multiplot\n",
             n - 1, dir);
    rc = run_gnuplot(sc, err, errlen);
    goto done;
io:
    snprintf(err, errlen, "cannot write plot data in %s", dir);
done:
    for (size_t j = 0; j < n; j++) {
        snprintf(path, sizeof path, "%s/ttft%zu.dat", dir, j);
        unlink(path);
        snprintf(path, sizeof path, "%s/tpot%zu.dat", dir, j);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/thr.dat", dir);
    unlink(path);
    rmdir(dir);
    free(v);
    free(sc);
    return rc;
}

int tdm_sim_plot_pareto(const char *png, const double *thr, const double *tpot99,
                        const int *frontier, const char *const *labels, size_t n, char *err,
                        size_t errlen)
{
    if (!have_gnuplot()) {
        snprintf(err, errlen, "gnuplot not found (install it: scripts/bootstrap)");
        return -1;
    }
    char dir[] = "/tmp/tandem-plot-XXXXXX";
    if (!mkdtemp(dir)) {
        snprintf(err, errlen, "cannot create a temporary directory");
        return -1;
    }
    char all[512], fr[512];
    snprintf(all, sizeof all, "%s/all.dat", dir);
    snprintf(fr, sizeof fr, "%s/front.dat", dir);
    FILE *a = fopen(all, "w"), *b = fopen(fr, "w");
    int rc = -1;
    if (!a || !b) {
        if (a) fclose(a);
        if (b) fclose(b);
        snprintf(err, errlen, "cannot write plot data");
        goto done;
    }
    /* frontier points sorted by TPOT for the line */
    size_t *idx = malloc((n ? n : 1) * sizeof *idx), m = 0;
    for (size_t i = 0; i < n; i++) {
        char nm[96];
        sanitize(nm, sizeof nm, labels[i]);
        fprintf(a, "%.6g %.6g \"%s\"\n", tpot99[i], thr[i], nm);
        if (frontier[i] && idx) idx[m++] = i;
    }
    for (size_t i = 1; i < m; i++)
        for (size_t j = i; j > 0 && tpot99[idx[j]] < tpot99[idx[j - 1]]; j--) {
            size_t t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    for (size_t i = 0; i < m; i++) fprintf(b, "%.6g %.6g\n", tpot99[idx[i]], thr[idx[i]]);
    free(idx);
    fclose(a);
    fclose(b);
    char sc[2048];
    snprintf(sc, sizeof sc,
             "set terminal pngcairo size 900,600 font ',10'\nset output '%s'\nset grid\n"
             "set title 'sweep: throughput vs p99 TPOT (line: Pareto frontier)'\n"
             "set xlabel 'p99 TPOT (ms)'\nset ylabel 'output tokens/s'\nset key bottom left box\nset offsets graph 0.05, graph 0.05, graph 0.1, graph 0.1\n"
             "plot '%s' u 1:2 w p pt 7 ps 1.2 t 'configs', '' u 1:2:3 w labels font ',7' "
             "offset 0,0.8 notitle, '%s' u 1:2 w lp lw 2 pt 6 ps 2 t 'Pareto frontier'\n",
             png, all, fr);
    rc = run_gnuplot(sc, err, errlen);
done:
    unlink(all);
    unlink(fr);
    rmdir(dir);
    return rc;
}
