/*
 * progress.c -- the progress bar on stderr: drawn only after the run has taken a second,
 * at most ten times a second, and only when the caller enabled it (the tools enable it when
 * stderr is a terminal and --quiet is not given). Erased at the end.
 */
#include <stdio.h>
#include <time.h>

#include "sim.h"

double tdm_sim_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void tdm_sim_progress_begin(tdm_sim_progress *p, int enabled, const char *label)
{
    p->enabled = enabled;
    p->drawn = 0;
    p->start_wall = tdm_sim_wall();
    p->last_draw = 0;
    p->label = label ? label : "sim";
}

void tdm_sim_progress_update(tdm_sim_progress *p, double frac, size_t done, size_t total,
                             double sim_t)
{
    if (!p->enabled) return;
    double now = tdm_sim_wall();
    if (now - p->start_wall < 1.0 || now - p->last_draw < 0.1) return;
    p->last_draw = now;
    p->drawn = 1;
    if (frac < 0) frac = 0;
    if (frac > 1) frac = 1;
    char bar[31];
    int k = (int)(frac * 30);
    for (int i = 0; i < 30; i++) bar[i] = i < k ? '#' : '.';
    bar[30] = '\0';
    fprintf(stderr, "\r%-16.16s [%s] %5.1f%%  %zu/%zu requests  t=%.1fs  %.1fs", p->label, bar,
            100 * frac, done, total, sim_t, now - p->start_wall);
    fflush(stderr);
}

void tdm_sim_progress_end(tdm_sim_progress *p)
{
    if (p->enabled && p->drawn) {
        fprintf(stderr, "\r%100s\r", "");
        fflush(stderr);
    }
    p->drawn = 0;
}
