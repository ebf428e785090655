/* analyze_svg.c — the chart of `nstf analyze --svg FILE`: cost against
 * accuracy for every layer matrix and candidate. x: bits per weight (the
 * candidate's cost), y: KL divergence of the final distributions (log
 * scale; a KL at or below 1e-9 is drawn at the floor), one point per
 * matrix and candidate, coloured by layer (blue for the first, red for
 * the last), with its tensor, candidate, KL and perplexity change as the
 * point's tooltip. Beside it, per layer, the mean KL of each candidate
 * (one polyline per candidate): which layers are the sensitive ones. */
#include "opt/analyze.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/xml.h"

#define KL_FLOOR 1e-9

typedef struct {
    double left, top, w, h;
    double x0, x1; /* linear */
    double y0, y1; /* log10 */
} panel;

static double sx(const panel *p, double v) { return p->left + (v - p->x0) / (p->x1 - p->x0) * p->w; }
static double sy(const panel *p, double kl) {
    const double v = log10(kl > KL_FLOOR ? kl : KL_FLOOR);
    return p->top + p->h - (v - p->y0) / (p->y1 - p->y0) * p->h;
}

/* layer t of [0, 1] as a colour from blue to red */
static void layer_color(double t, char out[8]) {
    const int r = (int)lround(40 + 200 * t), g = (int)lround(90 + 60 * sin(3.14159265358979323846 * t)), b = (int)lround(220 - 190 * t);
    snprintf(out, 8, "#%02x%02x%02x", r, g, b);
}

static void frame(FILE *f, const panel *p, const char *xlabel, bool x_int) {
    for (double e = p->y0; e <= p->y1 + 1e-9; e++) {
        const double y = p->top + p->h - (e - p->y0) / (p->y1 - p->y0) * p->h;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", p->left, y,
                p->left + p->w, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">1e%d</text>\n", p->left - 4, y + 4, (int)e);
    }
    const double step = x_int ? fmax(1.0, ceil((p->x1 - p->x0) / 10)) : 2.0;
    for (double v = ceil(p->x0 / step) * step; v <= p->x1 + 1e-9; v += step) {
        const double x = sx(p, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x, p->top, x,
                p->top + p->h);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", x, p->top + p->h + 15, v);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"black\"/>\n",
            p->left, p->top, p->w, p->h);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", p->left + p->w / 2,
            p->top + p->h + 34, xlabel);
    fprintf(f, "<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\">KL divergence "
               "(nats/token)</text>\n",
            p->left - 46, p->top + p->h / 2);
}

nstf_status nstf_analyze_svg(const char *path, const char *title, const nstf_analyze_result *r) {
    if (!path || !r) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_analyze_svg: NULL argument");
    if (r->n_rows < 1) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_analyze_svg: no rows to plot");
    double bmax = 1, kmin = 1e30, kmax = 0;
    int lmin = r->rows[0].layer, lmax = r->rows[0].layer;
    for (int i = 0; i < r->n_rows; i++) {
        const nstf_analyze_row *w = &r->rows[i];
        if (!isfinite(w->bpw) || !isfinite(w->score.kl))
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_analyze_svg: %s %s has a non-finite value", w->tensor,
                                  w->candidate);
        bmax = fmax(bmax, w->bpw);
        const double k = fmax(w->score.kl, KL_FLOOR);
        kmin = fmin(kmin, k);
        kmax = fmax(kmax, k);
        lmin = w->layer < lmin ? w->layer : lmin;
        lmax = w->layer > lmax ? w->layer : lmax;
    }
    double y0 = floor(log10(kmin)), y1 = ceil(log10(kmax));
    if (y1 <= y0) y1 = y0 + 1;
    const panel a = {70, 50, 520, 420, 0, ceil(bmax + 0.5), y0, y1};
    const panel b = {690, 50, 420, 420, lmin - 0.5, lmax + 0.5, y0, y1};
    FILE *f = fopen(path, "w");
    if (!f) return nstf_set_error(NSTF_ERR_IO, "cannot write SVG '%s': %s", path, strerror(errno));
    fputs("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1160\" height=\"560\" font-family=\"sans-serif\" "
          "font-size=\"11\">\n<rect width=\"1160\" height=\"560\" fill=\"white\"/>\n",
          f);
    fputs("<text x=\"580\" y=\"24\" text-anchor=\"middle\" font-size=\"14\">Sensitivity: ", f);
    nstf_xml_text(f, title ? title : "");
    fprintf(f, " (perplexity %.4f unmodified)</text>\n", r->base.ppl);

    /* left: every matrix and candidate */
    frame(f, &a, "bits per weight (cost)", false);
    for (int i = 0; i < r->n_rows; i++) {
        const nstf_analyze_row *w = &r->rows[i];
        char col[8];
        layer_color(lmax > lmin ? (double)(w->layer - lmin) / (lmax - lmin) : 0.0, col);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\" fill-opacity=\"0.75\"><title>", sx(&a, w->bpw),
                sy(&a, w->score.kl), col);
        nstf_xml_text(f, w->tensor);
        fputc(' ', f);
        nstf_xml_text(f, w->candidate);
        fprintf(f, ": %.2f bits/weight, KL %.3g, perplexity %+.3f%%</title></circle>\n", w->bpw, w->score.kl,
                100.0 * (w->score.ppl / r->base.ppl - 1));
    }
    char c0[8], c1[8];
    layer_color(0, c0);
    layer_color(1, c1);
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">layer %d</text>\n",
            a.left + a.w - 120, a.top + 14, c0, a.left + a.w - 112, a.top + 18, lmin);
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">layer %d</text>\n",
            a.left + a.w - 120, a.top + 30, c1, a.left + a.w - 112, a.top + 34, lmax);

    /* right: per layer, the mean KL of each candidate */
    frame(f, &b, "layer", true);
    static const char *pal[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                                "#7f7f7f", "#bcbd22", "#17becf"};
    const char *cands[16];
    int n_c = 0;
    for (int i = 0; i < r->n_rows && n_c < 16; i++) {
        bool seen = false;
        for (int c = 0; c < n_c && !seen; c++) seen = !strcmp(cands[c], r->rows[i].candidate);
        if (!seen) cands[n_c++] = r->rows[i].candidate;
    }
    for (int c = 0; c < n_c; c++) {
        const char *col = pal[c % 10];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", col);
        for (int l = lmin; l <= lmax; l++) {
            double sum = 0;
            int k = 0;
            for (int i = 0; i < r->n_rows; i++)
                if (r->rows[i].layer == l && !strcmp(r->rows[i].candidate, cands[c])) sum += r->rows[i].score.kl, k++;
            if (k) fprintf(f, "%.1f,%.1f ", sx(&b, l), sy(&b, sum / k));
        }
        fputs("\"/>\n", f);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\">",
                b.left + b.w + 8, b.top + 10 + 16 * c, b.left + b.w + 24, b.top + 10 + 16 * c, col, b.left + b.w + 28,
                b.top + 14 + 16 * c);
        nstf_xml_text(f, cands[c]);
        fputs("</text>\n", f);
    }
    fputs("<text x=\"900\" y=\"42\" text-anchor=\"middle\">mean KL per layer and candidate</text>\n", f);
    fputs("</svg>\n", f);
    if (fclose(f) != 0) return nstf_set_error(NSTF_ERR_IO, "error writing SVG '%s'", path);
    return NSTF_OK;
}
