/* Routing kernels for compiled routers (see routers/compiled.py).
 *
 * A model is registered once (its flat arrays stay owned by Python) and then
 * called by handle: route() computes feature set A (plus one-hot categories) from a
 * raw request's numbers and predicts; predict_batch() predicts a ready feature matrix.
 *
 * Tree ensembles are flat arrays: feature, threshold, left, right per node (left < 0
 * marks a leaf) and a value block per node. kind 0: scikit-learn trees, features
 * compared as float32 like scikit-learn does, class probabilities averaged; kind 1:
 * LightGBM, double comparisons, raw scores summed per class; kind 2: linear model,
 * scores = W x + b. The prediction is the first index of the largest score.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_MODELS 256
#define MAX_FEATURES 512
#define MAX_CLASSES 64

typedef struct {
    int kind, n_features, n_classes, n_trees, n_num, n_fam, n_suite;
    const int32_t *feature, *left, *right, *roots, *tree_class;
    const double *threshold, *value, *weights, *bias;
} Model;

static Model models[MAX_MODELS];
static int n_models = 0;

int register_model(int kind, int n_features, int n_classes, int n_trees, int n_num, int n_fam,
                   int n_suite, const int32_t *feature, const double *threshold,
                   const int32_t *left, const int32_t *right, const double *value,
                   const int32_t *roots, const int32_t *tree_class, const double *weights,
                   const double *bias) {
    if (n_models >= MAX_MODELS || n_features > MAX_FEATURES || n_classes > MAX_CLASSES) return -1;
    Model m = {kind, n_features, n_classes, n_trees, n_num, n_fam, n_suite, feature, left, right,
               roots, tree_class, threshold, value, weights, bias};
    models[n_models] = m;
    return n_models++;
}

static int argmax(const double *s, int n) {
    int best = 0;
    for (int k = 1; k < n; k++) if (s[k] > s[best]) best = k;
    return best;
}

static int predict_x(const Model *m, const double *x) {
    double score[MAX_CLASSES];
    memset(score, 0, sizeof(double) * m->n_classes);
    if (m->kind == 2) {
        for (int k = 0; k < m->n_classes; k++) {
            double z = m->bias[k];
            const double *w = m->weights + (long)k * m->n_features;
            for (int j = 0; j < m->n_features; j++) z += w[j] * x[j];
            score[k] = z;
        }
        if (m->n_classes == 1) return score[0] > 0 ? 1 : 0;
        return argmax(score, m->n_classes);
    }
    for (int t = 0; t < m->n_trees; t++) {
        int node = m->roots[t];
        while (m->left[node] >= 0) {
            double v = x[m->feature[node]];
            if (m->kind == 0) v = (double)(float)v;
            node = (v <= m->threshold[node]) ? m->left[node] : m->right[node];
        }
        if (m->kind == 0) {
            const double *val = m->value + (long)node * m->n_classes;
            for (int k = 0; k < m->n_classes; k++) score[k] += val[k];
        } else {
            score[m->tree_class[t]] += m->value[node];
        }
    }
    if (m->kind == 0 && m->n_trees > 1)  /* scikit-learn averages the trees' probabilities */
        for (int k = 0; k < m->n_classes; k++) score[k] /= m->n_trees;
    if (m->kind == 1 && m->n_classes == 1) return score[0] > 0 ? 1 : 0;
    return argmax(score, m->n_classes);
}

int route(int handle, double p, double o, double sp, double cc, double mp, int fam, int suite) {
    const Model *m = &models[handle];
    double x[MAX_FEATURES];
    x[0] = p; x[1] = o; x[2] = o / (p > 1.0 ? p : 1.0); x[3] = log1p(p); x[4] = log1p(o);
    x[5] = sp; x[6] = cc; x[7] = mp;
    int j = m->n_num;
    for (int k = 0; k < m->n_fam; k++) x[j + k] = (k == fam) ? 1.0 : 0.0;
    j += m->n_fam;
    for (int k = 0; k < m->n_suite; k++) x[j + k] = (k == suite) ? 1.0 : 0.0;
    return predict_x(m, x);
}

void predict_batch(int handle, const double *X, long n, int32_t *out) {
    const Model *m = &models[handle];
    for (long i = 0; i < n; i++) out[i] = predict_x(m, X + i * m->n_features);
}
