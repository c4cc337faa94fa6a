/* Routing kernels for compiled routers (see routers/compiler/: kernel.py builds and loads it).
 *
 * A model is registered once (its arrays are copied: the kernel owns them) and then
 * called by handle: a router object from make_router() reads a raw request's fields,
 * computes feature set A (plus one-hot categories) and predicts, in one CPython call;
 * predict_batch() predicts a ready feature matrix; shape_features() exposes the
 * feature arithmetic alone, for the test that holds it to dataset/features.py.
 *
 * Thresholds become bins. For each feature the model's distinct split thresholds are
 * sorted ("cuts"); a request's bin for that feature is the number of cuts below its
 * value (NaN: all of them, so it goes right as before), found by a branch-free binary
 * search. A split "x <= cuts[i]" is then exactly "bin <= i", so a node is 8 bytes
 * {threshold index, feature, left} and compares small integers: a few thousand
 * nodes fit in the L1 cache.
 *
 * The right child is left + 1, so a step is branch-free: i = left + (bin > threshold).
 * A leaf points to itself through a constant slot bins[n_features] = 0 with threshold
 * 0xFFFF, so a tree can take more steps than its depth and stay put. That lets GROUP
 * trees walk in lockstep for as many steps as the deepest of them: their load chains
 * are independent, so the core overlaps them (a tree walk costs load latency, not
 * arithmetic). Trees are walked in an order that puts trees of similar depth in one
 * group; scores are summed again in the original tree order when the walk runs to
 * the end, so the result is the one the original model computes.
 *
 * kind 0: scikit-learn trees; inputs rounded to float32 first, as scikit-learn does,
 * class probabilities summed in tree order then averaged. kind 1: LightGBM, double
 * comparisons, raw scores summed per class in tree order. kind 2: linear model,
 * scores = W x + b. The prediction is the first index of the largest score, or, for a
 * model with a cost decision (set_cost_decision), the cheapest allowed mode.
 *
 * Early exit (exact): before each group, for the leading class b and every other
 * class k, suffix sums (in walk order) of each tree's least leaf-by-leaf value of
 * (score_b - score_k) bound how much of b's lead the remaining trees can take back.
 * Once every lead survives that by a margin (far above any rounding difference
 * between summation orders), no remaining tree can change the argmax, so the walk
 * stops. Groups are padded with a zero-valued leaf tree.
 *
 * Region trees (build_region, below) decide most requests before any of this: see
 * the comment there.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MODELS 4096
#define MAX_FEATURES 512
#define MAX_CLASSES 256
#define MAX_STACK_TREES 8192
#define N_SHAPE 8            /* feature set A's columns, first in every row */
#define MAX_CONTENT_COLS 64  /* a content table's columns (dataset/content_features.py) */
#define MAX_SHARE 65536      /* the prompt's last tokens the content features read, at most */
#define STACK_IDS 4096       /* ids a decision converts on the stack */
#ifndef GROUP
#define GROUP 8
#endif

typedef struct {
    uint16_t threshold, feature; /* threshold: index into the feature's sorted cuts */
    int32_t left;
} Node;

typedef struct {
    int kind, n_features, n_classes, n_trees, n_real_trees, n_num, n_fam, n_suite, reordered;
    Node *nodes;
    const int32_t *roots, *steps, *tree_class, *position, *cut_start, *cut_count;
    const double *value, *weights, *bias, *sufdiff, *cuts;
    long n_nodes;
    Node *region;  /* the argmax as one tree over numeric bins; node c is the root of combination c */
    long region_nodes;
    double region_walk;  /* share of the bin grid (per combination, averaged) left to walk */
    /* cost decision (cost_modes > 0; set_cost_decision): the outputs are each mode's
       predicted log latency ratio (0 .. M-1) then its constraints' risk logits
       (M + j*C + c); the answer is the lowest ratio among modes whose every risk is at
       most the threshold (the reference always allowed, ratio 0), first index on ties */
    int cost_modes, cost_constraints, cost_ref;
    double cost_threshold, cost_cut;  /* the threshold as a probability and as a logit */
    double cost_lo, cost_hi;  /* a logit below cost_lo is surely allowed, above cost_hi surely not */
    int32_t *out_start;  /* tree models with a cost decision: output k's trees are original
                            trees out_start[k] .. out_start[k+1]-1 (set_output_ranges) */
    /* content features (set_content): the table's rows (content_vocab x content_cols: the
       share flags then the embedding projections, dataset/content_features.py), read
       through a request's token ids; numeric column N_SHAPE + i is feature content_pick[i] */
    double *content;
    long content_vocab;
    int content_cols, content_flags, content_share, content_tail;
    int32_t *content_pick;
} Model;

static Model models[MAX_MODELS];
static char in_use[MAX_MODELS];  /* slots are reused once a model is released */
static int n_models = 0;         /* slots ever used */

static void finish_x(const Model *m, double *x);
static int combo_of_row(const Model *m, const double *x);
void release_model(int handle);

int group_size(void) { return GROUP; }
int models_alive(void) {
    int n = 0;
    for (int i = 0; i < n_models; i++) n += in_use[i];
    return n;
}
int node_size(void) { return (int)sizeof(Node); }

static void *copy_array(const void *src, size_t size, long n) {
    if (src == NULL || n <= 0) return NULL;
    void *p = malloc(size * (size_t)n);
    if (p) memcpy(p, src, size * (size_t)n);
    return p;
}

/* Arrays by walk position t (n_trees, a multiple of GROUP): roots, tree_class, and
   steps per group; position[o] = walk position of original tree o (n_real_trees);
   value per node (n_classes wide for kind 0); cuts per feature. */
int register_model(int kind, int n_features, int n_classes, int n_trees, int n_real_trees, int n_num,
                   int n_fam, int n_suite, int n_nodes, const void *nodes, const double *value,
                   const int32_t *roots, const int32_t *steps, const int32_t *tree_class,
                   const int32_t *position, const double *cuts, const int32_t *cut_start,
                   const int32_t *cut_count, const double *weights, const double *bias,
                   const double *sufdiff) {
    int slot = 0;
    while (slot < n_models && in_use[slot]) slot++;
    if (slot >= MAX_MODELS || n_features > MAX_FEATURES || n_classes > MAX_CLASSES) return -1;
    if (n_trees % GROUP) return -1;
    long n_value = kind == 0 ? (long)n_nodes * n_classes : n_nodes;
    long n_bounds = (long)(n_trees + 1) * n_classes * n_classes;
    long n_cuts = 0;
    int reordered = 0;
    if (kind != 2) {
        for (int f = 0; f < n_features; f++)
            if (cut_start[f] + cut_count[f] > n_cuts) n_cuts = cut_start[f] + cut_count[f];
        for (int o = 0; o < n_real_trees; o++) if (position[o] != o) reordered = 1;
    }
    Model m = {kind, n_features, n_classes, n_trees, n_real_trees, n_num, n_fam, n_suite, reordered,
               copy_array(nodes, sizeof(Node), n_nodes), copy_array(roots, sizeof(int32_t), n_trees),
               copy_array(steps, sizeof(int32_t), n_trees / GROUP),
               copy_array(tree_class, sizeof(int32_t), n_trees),
               copy_array(position, sizeof(int32_t), n_real_trees),
               copy_array(cut_start, sizeof(int32_t), kind != 2 ? n_features : 0),
               copy_array(cut_count, sizeof(int32_t), kind != 2 ? n_features : 0),
               copy_array(value, sizeof(double), n_value),
               copy_array(weights, sizeof(double), (long)n_classes * n_features),
               copy_array(bias, sizeof(double), n_classes), copy_array(sufdiff, sizeof(double), n_bounds),
               copy_array(cuts, sizeof(double), n_cuts),
               n_nodes, NULL, 0, 1.0};
    models[slot] = m;
    in_use[slot] = 1;
    if (slot == n_models) n_models++;
    if ((kind != 2 && n_trees > 0 &&
         (!m.nodes || !m.roots || !m.steps || !m.value || !m.cut_start || !m.cut_count || !m.position)) ||
        (kind == 2 && (!m.weights || !m.bias))) {
        release_model(slot);  /* out of memory: free what was copied */
        return -1;
    }
    return slot;
}

/* Free a model's arrays; its slot can be reused. Called when the last reference to
   its router object goes (see make_router), never while a decision can still use it. */
void release_model(int handle) {
    if (handle < 0 || handle >= n_models || !in_use[handle]) return;
    Model *m = &models[handle];
    free(m->nodes); free((void *)m->roots); free((void *)m->steps); free((void *)m->tree_class);
    free((void *)m->position); free((void *)m->cut_start); free((void *)m->cut_count);
    free((void *)m->value); free((void *)m->weights); free((void *)m->bias); free((void *)m->sufdiff);
    free((void *)m->cuts); free(m->region); free(m->out_start); free(m->content); free(m->content_pick);
    memset(m, 0, sizeof(Model));
    in_use[handle] = 0;
}

/* Make a registered model answer the cost decision (see Model); before make_router. */
int set_cost_decision(int handle, int n_modes, int n_constraints, int ref, double threshold, double cut) {
    if (handle < 0 || handle >= n_models || !in_use[handle]) return -1;
    Model *m = &models[handle];
    if (n_modes < 1 || n_constraints < 0 || ref < 0 || ref >= n_modes ||
        n_modes * (1 + n_constraints) != m->n_classes || m->region)
        return -1;
    m->cost_modes = n_modes; m->cost_constraints = n_constraints; m->cost_ref = ref;
    m->cost_threshold = threshold; m->cost_cut = cut;
    if (cut == INFINITY) {  /* threshold >= 1: every probability is under it */
        m->cost_lo = m->cost_hi = INFINITY;
    } else if (cut == -INFINITY) {  /* threshold < 0: none; 0: only a probability that underflows to 0 */
        m->cost_lo = threshold < 0 ? -INFINITY : -800.0;
        m->cost_hi = threshold < 0 ? -INFINITY : -700.0;
    } else {
        double eps = 1e-9 * (1.0 + fabs(cut));
        m->cost_lo = cut - eps;
        m->cost_hi = cut + eps;
    }
    return 0;
}

/* Give a registered model its content table (copied): a row per vocabulary entry, its
   first n_flags columns averaged over the prompt's last `share` tokens, the rest over
   its last `tail` of those; numeric column N_SHAPE + i reads feature pick[i]. Before
   make_router. */
int set_content(int handle, const double *rows, long vocab, int n_cols, int n_flags, int share, int tail,
                const int32_t *pick) {
    if (handle < 0 || handle >= n_models || !in_use[handle]) return -1;
    Model *m = &models[handle];
    int n_pick = m->n_num - N_SHAPE;
    if (!rows || vocab < 1 || n_cols < 1 || n_cols > MAX_CONTENT_COLS || n_flags < 0 || n_flags > n_cols ||
        share < 1 || share > MAX_SHARE || tail < 1 || n_pick < 1 || m->content)
        return -1;
    for (int i = 0; i < n_pick; i++) if (pick[i] < 0 || pick[i] >= n_cols) return -1;
    m->content = copy_array(rows, sizeof(double), vocab * n_cols);
    m->content_pick = copy_array(pick, sizeof(int32_t), n_pick);
    if (!m->content || !m->content_pick) {
        free(m->content); free(m->content_pick);
        m->content = NULL; m->content_pick = NULL;
        return -1;
    }
    m->content_vocab = vocab; m->content_cols = n_cols; m->content_flags = n_flags;
    m->content_share = share; m->content_tail = tail;
    return 0;
}

/* The content features of a prompt's last ids (at most content_share of them, in
   order), as dataset/content_features.py's ContentTable.features computes them: each
   column summed in token order, then divided. 0, or -1 (an id is negative: *bad is the
   least) or -2 (an id is past the vocabulary: *bad is the first such). */
static int content_of(const Model *m, const long long *ids, long n, double *feat, long long *bad) {
    int nc = m->content_cols, nf = m->content_flags;
    for (int c = 0; c < nc; c++) feat[c] = 0.0;
    if (n <= 0) return 0;
    long long lo = 0;
    for (long i = 0; i < n; i++) if (ids[i] < lo) lo = ids[i];
    if (lo < 0) { *bad = lo; return -1; }
    for (long i = 0; i < n; i++)
        if (ids[i] >= m->content_vocab) { *bad = ids[i]; return -2; }
    long tail = n < m->content_tail ? n : m->content_tail;
    for (long i = 0; i < n; i++) {
        const double *r = m->content + ids[i] * nc;
        for (int c = 0; c < nf; c++) feat[c] += r[c];
    }
    for (long i = n - tail; i < n; i++) {
        const double *r = m->content + ids[i] * nc;
        for (int c = nf; c < nc; c++) feat[c] += r[c];
    }
    for (int c = 0; c < nf; c++) feat[c] /= (double)n;
    for (int c = nf; c < nc; c++) feat[c] /= (double)tail;
    return 0;
}

/* The content features of ids (the caller passes the prompt's last content_share),
   for the test that holds them to ContentTable.features: 0, -1 or -2 as content_of,
   -3 where the model has no content table. */
int content_features(int handle, const long long *ids, long n, double *out, long long *bad) {
    if (handle < 0 || handle >= n_models || !in_use[handle] || !models[handle].content) return -3;
    return content_of(&models[handle], ids, n, out, bad);
}

/* Output k's trees as contiguous runs of original trees (K + 1 starts): lets a cost
   decision sum only the outputs it needs (see predict_cost_lazy). */
int set_output_ranges(int handle, const int32_t *start) {
    if (handle < 0 || handle >= n_models || !in_use[handle]) return -1;
    Model *m = &models[handle];
    int K = m->n_classes;
    if (m->kind != 1 || start[0] != 0 || start[K] != m->n_real_trees) return -1;
    for (int k = 0; k < K; k++) if (start[k + 1] < start[k]) return -1;
    free(m->out_start);
    m->out_start = copy_array(start, sizeof(int32_t), K + 1);
    return m->out_start ? 0 : -1;
}

static int argmax(const double *s, int n) {
    int best = 0;
    for (int k = 1; k < n; k++) if (s[k] > s[best]) best = k;
    return best;
}

/* A risk logit against the threshold: by the logit where it is clear, by the
   probability the original computes (1 / (1 + exp(-z)), as LightGBM and scipy's expit
   do) where z is within rounding of the cut. */
static int risk_ok(const Model *m, double z) {
    if (z < m->cost_lo) return 1;
    if (z > m->cost_hi) return 0;
    return 1.0 / (1.0 + exp(-z)) <= m->cost_threshold;
}

static int decide_cost(const Model *m, const double *s) {
    int M = m->cost_modes, C = m->cost_constraints, best = -1;
    double best_r = 0.0;
    for (int j = 0; j < M; j++) {
        double r = 0.0;
        if (j != m->cost_ref) {
            int ok = 1;
            for (int c = 0; c < C && ok; c++) ok = risk_ok(m, s[M + j * C + c]);
            if (!ok) continue;
            r = s[j];
        }
        if (best < 0 || r < best_r) { best = j; best_r = r; }
    }
    return best;
}

/* The answer from a full score vector: the cost decision, else the argmax. */
static int decide(const Model *m, const double *s) {
    return m->cost_modes ? decide_cost(m, s) : argmax(s, m->n_classes);
}

/* Scores start at the bias where one is given (tree models: only outputs with no
   trees have one, so the trees' sums are the original's). */
static void init_scores(const Model *m, double *s) {
    if (m->bias && m->kind != 2) memcpy(s, m->bias, sizeof(double) * (size_t)m->n_classes);
    else memset(s, 0, sizeof(double) * (size_t)m->n_classes);
}

/* 1 when no remaining tree (from walk position t on) can change the argmax: the
   leader's lead over every other class k exceeds the least the remaining trees can
   add to (score_k - score_leader), taken leaf by leaf (sufdiff[t][leader][k]). */
static int decided(const Model *m, const double *score, int t) {
    int K = m->n_classes, best = argmax(score, K);
    const double *d = m->sufdiff + ((long)t * K + best) * K;
    for (int k = 0; k < K; k++) {
        if (k == best) continue;
        double margin = 1e-9 * (1.0 + fabs(score[best]) + fabs(score[k]) + fabs(d[k]));
        if (score[best] - score[k] + d[k] <= margin) return 0;
    }
    return 1;
}

/* The request's bin per feature: how many of the feature's cuts lie below x (NaN:
   all of them). Branch-free: a fixed number of halvings per feature. */
static void bins_of(const Model *m, const double *x, int32_t *bins, int n_features) {
    for (int f = 0; f < n_features; f++) {
        int n = m->cut_count[f];
        if (n == 0) { bins[f] = 0; continue; }
        const double *c = m->cuts + m->cut_start[f];
        double v = x[f];
        if (v != v) { bins[f] = n; continue; }
        const double *base = c;
        while (n > 1) {
            int half = n / 2;
            base = (base[half] < v) ? base + half : base;
            n -= half;
        }
        bins[f] = (int32_t)(base - c) + (*base < v);
    }
    bins[m->n_features] = 0;
}

static void add_leaf(const Model *m, double *score, int t, int32_t i) {
    int K = m->n_classes;
    if (m->kind == 0) {
        const double *val = m->value + (long)i * K;
        for (int k = 0; k < K; k++) score[k] += val[k];
    } else {
        score[m->tree_class[t]] += m->value[i];
    }
}

/* The class the original model predicts from its full per-class sums. */
static int class_of_sums(const Model *m, double *score) {
    int K = m->n_classes;
    if (m->kind == 0 && m->n_real_trees > 1)  /* scikit-learn averages the trees' probabilities */
        for (int k = 0; k < K; k++) score[k] /= m->n_real_trees;
    return (m->kind == 1 && K == 1 && !m->cost_modes) ? (score[0] > 0 ? 1 : 0) : decide(m, score);
}

/* One output's sum over its own trees, in the original order (the original's sum). */
static double output_sum(const Model *m, const int32_t *bins, int k) {
    const Node *nodes = m->nodes;
    double s = m->bias ? m->bias[k] : 0.0;
    int end = m->out_start[k + 1];
    /* GROUP trees at a time in lockstep (independent load chains overlap); a leaf
       stays put, so the group steps until every tree is at a leaf */
    for (int o = m->out_start[k]; o < end; o += GROUP) {
        int n = end - o < GROUP ? end - o : GROUP, moving = 1;
        int32_t i[GROUP];
        for (int j = 0; j < n; j++) i[j] = m->roots[m->position[o + j]];
        while (moving) {
            moving = 0;
            for (int j = 0; j < n; j++) {
                const Node nd = nodes[i[j]];
                moving |= nd.left != i[j];
                i[j] = nd.left + (bins[nd.feature] > (int32_t)nd.threshold);
            }
        }
        for (int j = 0; j < n; j++) s += m->value[i[j]];
    }
    return s;
}

/* The cost decision without summing every output: all modes' ratios, then modes in
   order of (ratio, index), each one's risks until one is allowed (the reference is
   always). The first allowed mode in that order is decide_cost's answer. */
static int predict_cost_lazy(const Model *m, const double *x) {
    int32_t bins[MAX_FEATURES + 1];
    double r[MAX_CLASSES];
    int order[MAX_CLASSES], M = m->cost_modes, C = m->cost_constraints;
    bins_of(m, x, bins, m->n_features);
    for (int j = 0; j < M; j++) {
        r[j] = j == m->cost_ref ? 0.0 : output_sum(m, bins, j);
        int a = j;  /* insertion sort by (ratio, index): a stable sort by ratio */
        while (a > 0 && r[order[a - 1]] > r[j]) { order[a] = order[a - 1]; a--; }
        order[a] = j;
    }
    for (int a = 0; a < M; a++) {
        int j = order[a], ok = 1;
        if (j == m->cost_ref) return j;
        for (int c = 0; c < C && ok; c++) ok = risk_ok(m, output_sum(m, bins, M + j * C + c));
        if (ok) return j;
    }
    return m->cost_ref;
}

static int predict_trees(const Model *m, const double *x) {
    if (m->out_start) return predict_cost_lazy(m, x);
    double score[MAX_CLASSES];
    int32_t bins[MAX_FEATURES + 1];
    int32_t stack_leaf[MAX_STACK_TREES], *leaf = stack_leaf;
    int K = m->n_classes, T = m->n_trees;
    init_scores(m, score);
    bins_of(m, x, bins, m->n_features);
    if (m->reordered && T > MAX_STACK_TREES && !(leaf = malloc(sizeof(int32_t) * (size_t)T))) return -1;
    const Node *nodes = m->nodes;
    int early = m->sufdiff != NULL && K > 1 && !m->cost_modes, result = -1;
    for (int t = 0; t < T; t += GROUP) {
        if (early && t > 0 && decided(m, score, t)) { result = argmax(score, K); break; }
        int32_t i[GROUP];
        for (int j = 0; j < GROUP; j++) i[j] = m->roots[t + j];
        for (int s = m->steps[t / GROUP]; s > 0; s--)
            for (int j = 0; j < GROUP; j++) {
                const Node nd = nodes[i[j]];
                i[j] = nd.left + (bins[nd.feature] > (int32_t)nd.threshold);
            }
        for (int j = 0; j < GROUP; j++) {
            add_leaf(m, score, t + j, i[j]);
            if (m->reordered) leaf[t + j] = i[j];
        }
    }
    if (result < 0) {
        if (m->reordered) {  /* the original model's summation order, for the exact sums */
            init_scores(m, score);
            for (int o = 0; o < m->n_real_trees; o++) add_leaf(m, score, m->position[o], leaf[m->position[o]]);
        }
        result = class_of_sums(m, score);
    }
    if (leaf != stack_leaf) free(leaf);
    return result;
}

/* ------------------------------------------------------------ region trees
 *
 * The ensemble's prediction is constant on every box of the bin grid whose sides do
 * not cross a split; its argmax is often constant on much larger boxes. build_region()
 * finds such boxes by cutting (a "born-again" tree): for a box, each tree's reachable
 * leaves bound what it can add per class; if one class's floor beats every other
 * class's ceiling by the margin, the box is a leaf with that class. If no split
 * crosses the box, every tree reaches one leaf and the box's class is computed exactly
 * as predict_trees computes it (original order). Otherwise the box is cut at the split
 * that the most reachable nodes share. Boxes are taken in priority order (most sample
 * rows, then biggest) until the budget runs out; the rest become WALK leaves, and a
 * decision that lands in one walks the trees. One-hot categories are fixed per root
 * (one region tree per family x suite combination, unseen categories included), so a
 * decision is a binary search per numeric feature and one walk down one tree. */
typedef struct {
    const Model *m;
    int32_t *lo, *hi, *stack, *count, *touched, *cut_feature;
    double *smin, *smax;
    Node *out;
    long n_out, cap, work, max_work;
} Builder;

static int exact_class(const Model *m, const int32_t *bins) {
    double score[MAX_CLASSES];
    init_scores(m, score);
    const Node *nodes = m->nodes;
    for (int o = 0; o < m->n_real_trees; o++) {
        int t = m->position[o];
        int32_t i = m->roots[t];
        while (nodes[i].left != i) i = nodes[i].left + (bins[nodes[i].feature] > (int32_t)nodes[i].threshold);
        add_leaf(m, score, t, i);
    }
    return class_of_sums(m, score);
}

/* Bounds of every class's score over the box; counts the splits crossing it. */
static long box_bounds(Builder *b, int *n_touched) {
    const Model *m = b->m;
    const Node *nodes = m->nodes;
    int K = m->n_classes;
    double tmin[MAX_CLASSES], tmax[MAX_CLASSES];
    long active = 0;
    *n_touched = 0;
    init_scores(m, b->smin);
    memcpy(b->smax, b->smin, sizeof(double) * (size_t)K);
    for (int t = 0; t < m->n_trees; t++) {
        int W = m->kind == 0 ? K : 1;
        for (int k = 0; k < W; k++) { tmin[k] = INFINITY; tmax[k] = -INFINITY; }
        int sp = 0;
        b->stack[sp++] = m->roots[t];
        while (sp) {
            int32_t i = b->stack[--sp];
            Node nd = nodes[i];
            b->work++;
            if (nd.left == i) {
                const double *val = m->value + (long)i * W;
                for (int k = 0; k < W; k++) {
                    if (val[k] < tmin[k]) tmin[k] = val[k];
                    if (val[k] > tmax[k]) tmax[k] = val[k];
                }
                continue;
            }
            int go_left = b->lo[nd.feature] <= nd.threshold, go_right = b->hi[nd.feature] > nd.threshold;
            if (go_left && go_right) {
                int g = m->cut_start[nd.feature] + nd.threshold;
                if (b->count[g]++ == 0) b->touched[(*n_touched)++] = g;
                active++;
            }
            if (go_right) b->stack[sp++] = nd.left + 1;
            if (go_left) b->stack[sp++] = nd.left;
        }
        if (m->kind == 0) {
            for (int k = 0; k < K; k++) { b->smin[k] += tmin[k]; b->smax[k] += tmax[k]; }
        } else {
            int c = m->tree_class[t];
            b->smin[c] += tmin[0];
            b->smax[c] += tmax[0];
        }
    }
    return active;
}

/* The cost decision over a box: decided when one mode surely allowed (the reference,
   or every risk's ceiling under the cut) has a ratio ceiling below the ratio floor of
   every other mode that may be allowed. */
static int box_decision_cost(const Builder *b) {
    const Model *m = b->m;
    int M = m->cost_modes, C = m->cost_constraints;
    int state[MAX_CLASSES];  /* 1 surely allowed, 0 maybe, -1 surely not */
    int best = m->cost_ref;
    for (int j = 0; j < M; j++) {
        state[j] = 1;
        if (j == m->cost_ref) continue;
        for (int c = 0; c < C; c++) {
            int o = M + j * C + c;
            if (b->smin[o] > m->cost_hi) { state[j] = -1; break; }
            if (!(b->smax[o] < m->cost_lo)) state[j] = 0;
        }
        if (state[j] == 1 && b->smax[j] < (best == m->cost_ref ? 0.0 : b->smax[best])) best = j;
    }
    double ceil_best = best == m->cost_ref ? 0.0 : b->smax[best];
    double margin = 1e-9 * (1.0 + fabs(ceil_best));
    for (int j = 0; j < M; j++) {
        if (j == best || state[j] < 0) continue;
        double floor_j = j == m->cost_ref ? 0.0 : b->smin[j];
        if (!(floor_j > ceil_best + margin)) return -1;
    }
    return best;
}

static int box_decision(const Builder *b) {
    const Model *m = b->m;
    int K = m->n_classes;
    if (m->cost_modes) return box_decision_cost(b);
    if (m->kind == 1 && K == 1) {
        double margin = 1e-9 * (1.0 + fabs(b->smin[0]) + fabs(b->smax[0]));
        if (b->smin[0] > margin) return 1;
        if (b->smax[0] < -margin) return 0;
        return -1;
    }
    int best = argmax(b->smin, K);
    double floor_best = b->smin[best];
    double margin = 1e-9 * (1.0 + fabs(floor_best));
    for (int k = 0; k < K; k++)
        if (k != best && b->smax[k] >= floor_best - margin) return -1;
    return best;
}

#define WALK INT32_MIN  /* region leaf whose box is undecided: walk the trees */

typedef struct {
    long at;          /* the region node this box becomes */
    double volume;    /* its share of its combination's bin grid */
    long start, end;  /* its sample rows: rows[start:end] */
    int32_t combo;
} Pending;

/* Max-heap of pending boxes by volume; their bounds live in lohi[slot]. */
typedef struct {
    Pending *items;
    int32_t *slot, *free_slots, *lohi;
    long n, n_free, width;
} Heap;

/* Boxes holding more sample rows first (where traffic is), then bigger boxes. */
static double priority(const Pending *p) { return (double)(p->end - p->start) + p->volume; }

static int heap_before(const Heap *h, long a, long b) {
    return priority(&h->items[a]) > priority(&h->items[b]);
}

static void heap_swap(Heap *h, long a, long b) {
    Pending p = h->items[a]; h->items[a] = h->items[b]; h->items[b] = p;
    int32_t s = h->slot[a]; h->slot[a] = h->slot[b]; h->slot[b] = s;
}

static void heap_push(Heap *h, Pending p, const int32_t *lo, const int32_t *hi) {
    long i = h->n++;
    int32_t s = h->free_slots[--h->n_free];
    h->items[i] = p;
    h->slot[i] = s;
    memcpy(h->lohi + (long)s * h->width, lo, sizeof(int32_t) * (size_t)(h->width / 2));
    memcpy(h->lohi + (long)s * h->width + h->width / 2, hi, sizeof(int32_t) * (size_t)(h->width / 2));
    while (i > 0 && heap_before(h, i, (i - 1) / 2)) { heap_swap(h, i, (i - 1) / 2); i = (i - 1) / 2; }
}

/* Pops the biggest box into (lo, hi) for the numeric features. */
static Pending heap_pop(Heap *h, int32_t *lo, int32_t *hi) {
    Pending top = h->items[0];
    int32_t s = h->slot[0];
    memcpy(lo, h->lohi + (long)s * h->width, sizeof(int32_t) * (size_t)(h->width / 2));
    memcpy(hi, h->lohi + (long)s * h->width + h->width / 2, sizeof(int32_t) * (size_t)(h->width / 2));
    h->free_slots[h->n_free++] = s;
    h->n--;
    if (h->n > 0) {
        h->items[0] = h->items[h->n];
        h->slot[0] = h->slot[h->n];
        long i = 0;
        for (;;) {
            long l = 2 * i + 1, r = l + 1, best = i;
            if (l < h->n && heap_before(h, l, best)) best = l;
            if (r < h->n && heap_before(h, r, best)) best = r;
            if (best == i) break;
            heap_swap(h, i, best);
            i = best;
        }
    }
    return top;
}

/* Evaluate the box in (b->lo, b->hi): the class it decides (>= 0), or -1 with the cut to
   split it at in *split (global cut index). */
static int evaluate_box(Builder *b, int *split) {
    int n_touched;
    long active = box_bounds(b, &n_touched);
    int cls = active == 0 ? exact_class(b->m, b->lo) : box_decision(b);
    int best_g = -1;
    for (int j = 0; j < n_touched; j++) {
        int g = b->touched[j];
        if (cls < 0 && (best_g < 0 || b->count[g] > b->count[best_g] ||
                        (b->count[g] == b->count[best_g] && g < best_g)))
            best_g = g;
    }
    for (int j = 0; j < n_touched; j++) b->count[b->touched[j]] = 0;
    *split = best_g;
    return cls;
}

static void set_combo(Builder *b, int combo) {
    const Model *m = b->m;
    int nf = m->n_features, fam = combo / (m->n_suite + 1), suite = combo % (m->n_suite + 1);
    double x[MAX_FEATURES + 1];
    int32_t bins[MAX_FEATURES + 1];
    memset(x, 0, sizeof(double) * (size_t)nf);
    if (fam < m->n_fam) x[m->n_num + fam] = 1.0;
    if (suite < m->n_suite) x[m->n_num + m->n_fam + suite] = 1.0;
    bins_of(m, x, bins, nf);
    for (int f = m->n_num; f < nf; f++) b->lo[f] = b->hi[f] = bins[f];
}

static double share(const Model *m, int f, int32_t lo, int32_t hi) {
    return (double)(hi - lo + 1) / (double)(m->cut_count[f] + 1);
}

/* Build the region trees of a tree model, undecided boxes holding the most sample rows
   (a sample of the training inputs: where traffic is expected) first, then the
   biggest, until every box is decided or the node or work budget runs out; boxes left
   undecided become WALK leaves (those decisions walk the trees). Returns the node
   count, -2 when out of memory. */
long build_region(int handle, long max_nodes, long max_work, const double *sample, long n_sample) {
    Model *m = &models[handle];
    if (m->kind == 2 || m->region) return m->region ? m->region_nodes : 0;
    int nf = m->n_features, nn = m->n_num, n_cuts = 0, n_combos = (m->n_fam + 1) * (m->n_suite + 1);
    for (int f = 0; f < nf; f++) n_cuts += m->cut_count[f];
    Builder b = {0};
    Heap h = {0};
    b.m = m;
    b.cap = max_nodes > n_combos ? max_nodes : n_combos;
    b.max_work = max_work;
    b.lo = calloc(nf + 1, sizeof(int32_t));
    b.hi = calloc(nf + 1, sizeof(int32_t));
    b.count = calloc(n_cuts + 1, sizeof(int32_t));
    b.touched = calloc(n_cuts + 1, sizeof(int32_t));
    b.cut_feature = calloc(n_cuts + 1, sizeof(int32_t));
    b.smin = calloc(MAX_CLASSES, sizeof(double));
    b.smax = calloc(MAX_CLASSES, sizeof(double));
    b.stack = malloc(sizeof(int32_t) * (size_t)(m->n_nodes + 1));
    b.out = malloc(sizeof(Node) * (size_t)b.cap);
    h.width = 2 * (nn > 0 ? nn : 1);
    h.items = malloc(sizeof(Pending) * (size_t)(b.cap + 1));
    h.slot = malloc(sizeof(int32_t) * (size_t)(b.cap + 1));
    h.free_slots = malloc(sizeof(int32_t) * (size_t)(b.cap + 1));
    h.lohi = malloc(sizeof(int32_t) * (size_t)(b.cap + 1) * (size_t)h.width);
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)(n_sample + 1));
    int32_t *row_bins = malloc(sizeof(int32_t) * (size_t)(n_sample + 1) * (size_t)(nf + 1));
    int32_t *row_combo = malloc(sizeof(int32_t) * (size_t)(n_sample + 1));
    long result = 0;
    if (!rows || !row_bins || !row_combo || !b.lo || !b.hi || !b.count || !b.touched || !b.cut_feature || !b.smin || !b.smax || !b.stack ||
        !b.out || !h.items || !h.slot || !h.free_slots || !h.lohi) {
        result = -2;
    } else {
        for (int f = 0; f < nf; f++)
            for (int c = 0; c < m->cut_count[f]; c++) b.cut_feature[m->cut_start[f] + c] = f;
        for (long s = 0; s <= b.cap; s++) h.free_slots[s] = (int32_t)(b.cap - s);
        h.n_free = b.cap + 1;
        b.n_out = n_combos;
        /* sample rows grouped by combination (rows that are not one-hot are left out) */
        long n_rows = 0;
        double x[MAX_FEATURES + 1];
        for (long r = 0; r < n_sample; r++) {
            memcpy(x, sample + r * nf, sizeof(double) * (size_t)nf);
            finish_x(m, x);
            row_combo[r] = combo_of_row(m, x);
            bins_of(m, x, row_bins + r * (nf + 1), nf);
        }
        for (int f = 0; f < nn; f++) { b.lo[f] = 0; b.hi[f] = m->cut_count[f]; }
        for (int c = 0; c < n_combos; c++) {
            long start = n_rows;
            for (long r = 0; r < n_sample; r++) if (row_combo[r] == c) rows[n_rows++] = (int32_t)r;
            heap_push(&h, (Pending){c, 1.0, start, n_rows, c}, b.lo, b.hi);
        }
        double walk = 0.0;
        while (h.n > 0) {
            Pending p = heap_pop(&h, b.lo, b.hi);
            if (b.work > b.max_work) {  /* out of time: the rest walk */
                walk += p.volume;
                b.out[p.at].left = WALK;
                b.out[p.at].feature = b.out[p.at].threshold = 0;
                continue;
            }
            set_combo(&b, p.combo);
            int g, cls = evaluate_box(&b, &g);
            if (cls >= 0 || b.n_out + 2 > b.cap) {
                if (cls < 0) walk += p.volume;
                b.out[p.at].left = cls >= 0 ? -(cls + 1) : WALK;
                b.out[p.at].feature = b.out[p.at].threshold = 0;
                continue;
            }
            int f = b.cut_feature[g];
            int32_t c = g - m->cut_start[f];
            long a = b.n_out;
            b.n_out += 2;
            b.out[p.at].feature = (uint16_t)f;
            b.out[p.at].threshold = (uint16_t)c;
            b.out[p.at].left = (int32_t)a;
            long mid = p.start;  /* rows with bin <= c first */
            for (long j = p.start; j < p.end; j++)
                if (row_bins[(long)rows[j] * (nf + 1) + f] <= c) {
                    int32_t tmp = rows[mid]; rows[mid] = rows[j]; rows[j] = tmp;
                    mid++;
                }
            double whole = share(m, f, b.lo[f], b.hi[f]);
            int32_t save = b.hi[f];
            b.hi[f] = c;
            heap_push(&h, (Pending){a, p.volume * share(m, f, b.lo[f], c) / whole, p.start, mid, p.combo},
                      b.lo, b.hi);
            b.hi[f] = save;
            b.lo[f] = c + 1;
            heap_push(&h, (Pending){a + 1, p.volume * share(m, f, c + 1, save) / whole, mid, p.end, p.combo},
                      b.lo, b.hi);
        }
        result = b.n_out;
        m->region_walk = walk / n_combos;
    }
    if (result > 0) {
        Node *region = realloc(b.out, sizeof(Node) * (size_t)b.n_out);
        m->region = region ? region : b.out;
        m->region_nodes = b.n_out;
    } else {
        free(b.out);
    }
    free(b.lo); free(b.hi); free(b.count); free(b.touched); free(b.cut_feature);
    free(b.smin); free(b.smax); free(b.stack);
    free(h.items); free(h.slot); free(h.free_slots); free(h.lohi);
    free(rows); free(row_bins); free(row_combo);
    return result;
}

/* Share of the region's volume (per combination, averaged) that WALK leaves cover:
   how much of the input space still walks the trees. */
double region_walk_share(int handle) {
    const Model *m = &models[handle];
    return m->region ? m->region_walk : 1.0;
}

/* The class from the region tree of this (family, suite) combination. */
static int predict_region(const Model *m, const double *x, int combo) {
    int32_t bins[MAX_FEATURES + 1];
    bins_of(m, x, bins, m->n_num);
    const Node *r = m->region;
    int32_t i = combo;
    while (r[i].left >= 0) i = r[i].left + (bins[r[i].feature] > (int32_t)r[i].threshold);
    return r[i].left == WALK ? -1 : -r[i].left - 1;
}

/* x has n_features slots, already rounded to float32 for kind 0. */
static int predict_x(const Model *m, const double *x, int combo) {
    if (m->kind == 2) {
        double score[MAX_CLASSES];
        int K = m->n_classes;
        /* one-hot columns are 0 or 1: adding w*0 changes nothing, so only the numeric
           columns and the set categories are summed (same result, fewer operations) */
        int n_num = m->n_num, nf = m->n_features;
        for (int k = 0; k < K; k++) {
            double z = m->bias[k];
            const double *w = m->weights + (long)k * nf;
            for (int j = 0; j < n_num; j++) z += w[j] * x[j];
            for (int j = n_num; j < nf; j++) if (x[j] != 0.0) z += w[j] * x[j];
            score[k] = z;
        }
        if (K == 1 && !m->cost_modes) return score[0] > 0 ? 1 : 0;
        return decide(m, score);
    }
    if (m->region && combo >= 0) {
        int k = predict_region(m, x, combo);
        if (k >= 0) return k;
    }
    return predict_trees(m, x);
}

static int combo_of(const Model *m, int fam, int suite) {
    return (fam < 0 ? m->n_fam : fam) * (m->n_suite + 1) + (suite < 0 ? m->n_suite : suite);
}

/* The (family, suite) combination of a feature row's one-hot columns; -1 when they are
   not one-hot (the lockstep walk then takes the row as it is). */
static int combo_of_row(const Model *m, const double *x) {
    int idx[2] = {-1, -1}, start[2] = {m->n_num, m->n_num + m->n_fam}, n[2] = {m->n_fam, m->n_suite};
    for (int a = 0; a < 2; a++)
        for (int k = 0; k < n[a]; k++) {
            double v = x[start[a] + k];
            if (v == 1.0 && idx[a] < 0) idx[a] = k;
            else if (v != 0.0) return -1;
        }
    return combo_of(m, idx[0], idx[1]);
}

static void finish_x(const Model *m, double *x) {
    if (m->kind == 0)
        for (int j = 0; j < m->n_features; j++) x[j] = (double)(float)x[j];
}

/* Feature set A from a request's raw numbers, in dataset/features.py's FEATURE_FORMULAS
   order (tests/test_features.py checks every feature against those formulas). */
void shape_features(double p, double o, double sp, double cc, double mp, double *x) {
    x[0] = p; x[1] = o; x[2] = o / (p > 1.0 ? p : 1.0); x[3] = log1p(p); x[4] = log1p(o);
    x[5] = sp; x[6] = cc; x[7] = mp;
}

static void fill_x(const Model *m, double *x, double p, double o, double sp, double cc, double mp,
                   int fam, int suite) {
    shape_features(p, o, sp, cc, mp, x);
    int j = m->n_num;
    for (int k = 0; k < m->n_fam; k++) x[j + k] = (k == fam) ? 1.0 : 0.0;
    j += m->n_fam;
    for (int k = 0; k < m->n_suite; k++) x[j + k] = (k == suite) ? 1.0 : 0.0;
    finish_x(m, x);
}

/* How many rows of a ready feature matrix the region tree decides (the rest walk). */
long region_hits(int handle, const double *X, long n) {
    const Model *m = &models[handle];
    if (!m->region) return 0;
    double x[MAX_FEATURES + 1];
    long hits = 0;
    for (long i = 0; i < n; i++) {
        memcpy(x, X + i * m->n_features, sizeof(double) * (size_t)m->n_features);
        finish_x(m, x);
        int combo = combo_of_row(m, x);
        hits += combo >= 0 && predict_region(m, x, combo) >= 0;
    }
    return hits;
}

void predict_batch(int handle, const double *X, long n, int32_t *out) {
    const Model *m = &models[handle];
    double x[MAX_FEATURES + 1];
    size_t row = sizeof(double) * (size_t)m->n_features;
    for (long i = 0; i < n; i++) {
        memcpy(x, X + i * m->n_features, row);
        finish_x(m, x);
        out[i] = predict_x(m, x, m->region ? combo_of_row(m, x) : -1);
    }
}

/* ---------------------------------------------------------------- CPython */
static PyObject *s_p, *s_o, *s_sp, *s_cc, *s_mp, *s_fam, *s_suite, *s_none, *s_ids, *s_id;

static int get_double(PyObject *obj, PyObject *name, double *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v) return -1;
    *out = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static int get_category(PyObject *obj, PyObject *name, PyObject *index) {
    if (index == Py_None) return -1;
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v) return -2;
    PyObject *key = (v == Py_None || (PyUnicode_Check(v) && PyUnicode_GET_LENGTH(v) == 0)) ? s_none : v;
    PyObject *i = PyDict_GetItemWithError(index, key);
    Py_DECREF(v);
    if (!i) return PyErr_Occurred() ? -2 : -1;
    return (int)PyLong_AsLong(i);
}

/* A request's content columns into x (numeric columns N_SHAPE ..): its prompt_token_ids'
   last content_share ids through the model's table. Errors are raised as `error`
   (self's InputError), naming the request or the id and the table's model. */
static int content_x(const Model *m, PyObject *self, PyObject *req, double *x) {
    PyObject *error = PyTuple_GET_ITEM(self, 5), *model = PyTuple_GET_ITEM(self, 6);
    PyObject *ids = PyObject_GetAttr(req, s_ids);
    if (!ids) return -1;
    if (ids == Py_None) {
        Py_DECREF(ids);
        PyObject *rid = PyObject_GetAttr(req, s_id);
        if (rid) {
            PyErr_Format(error, "request %S: the router reads the prompt's token ids; it carries none", rid);
            Py_DECREF(rid);
        }
        return -1;
    }
    PyObject *seq = PySequence_Fast(ids, "prompt_token_ids must be a sequence of token ids");
    Py_DECREF(ids);
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), start = n > m->content_share ? n - m->content_share : 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    long long buf[STACK_IDS], *ids_c = buf;  /* a longer window goes to the heap */
    if (n - start > STACK_IDS && !(ids_c = malloc(sizeof(long long) * (size_t)(n - start)))) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = start; i < n; i++) {
        ids_c[i - start] = PyLong_AsLongLong(items[i]);
        if (ids_c[i - start] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            if (ids_c != buf) free(ids_c);
            return -1;
        }
    }
    Py_DECREF(seq);
    double feat[MAX_CONTENT_COLS];
    long long bad = 0;
    int got = content_of(m, ids_c, (long)(n - start), feat, &bad);
    if (ids_c != buf) free(ids_c);
    if (got == -1) {
        PyErr_Format(error, "token id %lld is negative: not an id of %S's vocabulary", bad, model);
        return -1;
    }
    if (got == -2) {
        PyErr_Format(error, "token id %lld is outside %S's vocabulary of %ld: content features read ids of the "
                     "model they were made for", bad, model, m->content_vocab);
        return -1;
    }
    for (int i = 0; i < m->n_num - N_SHAPE; i++) x[N_SHAPE + i] = feat[m->content_pick[i]];
    return 0;
}

/* A router object's call: self = (handle, classes, fam_index, suite_index, owner[, error,
   model]: the last two where the model reads content). */
static PyObject *router_call(PyObject *self, PyObject *req) {
    int handle = (int)PyLong_AsLong(PyTuple_GET_ITEM(self, 0));
    double p, o, sp, cc, mp;
    if (get_double(req, s_p, &p) || get_double(req, s_o, &o) || get_double(req, s_sp, &sp) ||
        get_double(req, s_cc, &cc) || get_double(req, s_mp, &mp))
        return NULL;
    int fam = get_category(req, s_fam, PyTuple_GET_ITEM(self, 2));
    int suite = get_category(req, s_suite, PyTuple_GET_ITEM(self, 3));
    if (fam == -2 || suite == -2) return NULL;
    const Model *m = &models[handle];
    double x[MAX_FEATURES + 1];
    if (m->content ? content_x(m, self, req, x) : m->n_num > N_SHAPE) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "this compiled router reads content columns and holds no content table");
        return NULL;
    }
    fill_x(m, x, p, o, sp, cc, mp, fam, suite);
    int k = predict_x(m, x, combo_of(m, fam, suite));
    if (k < 0) return PyErr_NoMemory();
    PyObject *label = PyTuple_GET_ITEM(PyTuple_GET_ITEM(self, 1), k);
    Py_INCREF(label);
    return label;
}

static PyMethodDef router_def = {"route", (PyCFunction)router_call, METH_O,
                                 "route(request) -> mode: one routing decision from a raw request."};

static void release_capsule(PyObject *capsule) {
    release_model((int)(intptr_t)PyCapsule_GetContext(capsule));
}

/* make_router(handle, classes, fam_index, suite_index[, error, model]) -> callable(request)
   -> label. A builtin function bound to its model: one C call per decision, no Python
   frame. It owns the model: when the callable is garbage, the model is released. A
   model with a content table (set_content) needs `error` (the exception class its
   request errors are raised as) and `model` (the table's model, named in them). */
static PyObject *py_make_router(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if ((nargs != 4 && nargs != 6) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "make_router(handle, classes: tuple, fam_index, suite_index"
                        "[, error, model])");
        return NULL;
    }
    long handle = PyLong_AsLong(args[0]);
    if (handle < 0 || handle >= n_models || !in_use[handle]) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "unknown compiled-router handle");
        return NULL;
    }
    const Model *mh = &models[handle];
    if (mh->content && (nargs != 6 || !PyExceptionClass_Check(args[4]))) {
        PyErr_SetString(PyExc_TypeError, "a model reading content needs make_router's error class and model");
        return NULL;
    }
    if (PyTuple_GET_SIZE(args[1]) != (mh->cost_modes ? mh->cost_modes : mh->n_classes + (mh->n_classes == 1))) {
        PyErr_SetString(PyExc_ValueError, "classes do not match the registered model");
        return NULL;
    }
    for (int k = 2; k < 4; k++)
        if (args[k] != Py_None && !PyDict_Check(args[k])) {
            PyErr_SetString(PyExc_TypeError, "category indexes must be dicts or None");
            return NULL;
        }
    static char owner_name[] = "modeswitch.compiled_router";
    PyObject *owner = PyCapsule_New(&models[handle], owner_name, release_capsule);
    if (!owner) return NULL;
    if (PyCapsule_SetContext(owner, (void *)(intptr_t)handle)) { Py_DECREF(owner); return NULL; }
    PyObject *self = nargs == 6 ? PyTuple_Pack(7, args[0], args[1], args[2], args[3], owner, args[4], args[5])
                                : PyTuple_Pack(5, args[0], args[1], args[2], args[3], owner);
    Py_DECREF(owner);
    if (!self) return NULL;
    PyObject *fn = PyCFunction_NewEx(&router_def, self, NULL);
    Py_DECREF(self);
    return fn;
}

static PyMethodDef methods[] = {
    {"make_router", (PyCFunction)(void (*)(void))py_make_router, METH_FASTCALL,
     "A callable making one routing decision from a raw request object."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_modeswitch_kernels", NULL, -1, methods};

PyMODINIT_FUNC PyInit__modeswitch_kernels(void) {
    s_p = PyUnicode_InternFromString("prompt_tokens");
    s_o = PyUnicode_InternFromString("expected_output_tokens");
    s_sp = PyUnicode_InternFromString("shared_prefix_tokens");
    s_cc = PyUnicode_InternFromString("concurrent_requests");
    s_mp = PyUnicode_InternFromString("memory_pressure");
    s_fam = PyUnicode_InternFromString("family");
    s_suite = PyUnicode_InternFromString("benchmark_suite");
    s_none = PyUnicode_InternFromString("none");
    s_ids = PyUnicode_InternFromString("prompt_token_ids");
    s_id = PyUnicode_InternFromString("id");
    return PyModule_Create(&module);
}
