/* Routing kernels for compiled routers (see routers/compiled.py).
 *
 * A model is registered once (its arrays are copied: the kernel owns them) and then
 * called by handle: route_request() reads a raw request object's fields, computes
 * feature set A (plus one-hot categories) and predicts, in one CPython fast call;
 * route() does the same from plain numbers (ctypes); predict_batch() predicts a
 * ready feature matrix.
 *
 * Tree ensembles are packed nodes {threshold, feature, left, right} (left < 0 marks a
 * leaf) and a value block per node. kind 0: scikit-learn trees, features compared as
 * float32 like scikit-learn does, class probabilities averaged; kind 1: LightGBM,
 * double comparisons, raw scores summed per class; kind 2: linear model,
 * scores = W x + b. The prediction is the first index of the largest score.
 *
 * Early exit (exact): for every tree position t the caller passes, per class, the
 * largest and smallest total the remaining trees can still add (suffix sums of the
 * per-tree leaf maxima/minima). Once the leading class's smallest possible final
 * score beats every other class's largest possible one by a margin, no remaining
 * tree can change the argmax, so the loop stops.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MODELS 4096
#define MAX_FEATURES 512
#define MAX_CLASSES 64
#define CHECK_EVERY 2

typedef struct {
    double threshold;
    int32_t feature, left, right, pad;
} Node;

typedef struct {
    int kind, n_features, n_classes, n_trees, n_num, n_fam, n_suite;
    Node *nodes;
    const int32_t *roots, *tree_class;
    const double *value, *weights, *bias, *sufmax, *sufmin;
} Model;

static Model models[MAX_MODELS];
static int n_models = 0;

static void *copy_array(const void *src, size_t size, long n) {
    if (src == NULL || n <= 0) return NULL;
    void *p = malloc(size * (size_t)n);
    if (p) memcpy(p, src, size * (size_t)n);
    return p;
}

int register_model(int kind, int n_features, int n_classes, int n_trees, int n_num, int n_fam,
                   int n_suite, int n_nodes, const int32_t *feature, const double *threshold,
                   const int32_t *left, const int32_t *right, const double *value,
                   const int32_t *roots, const int32_t *tree_class, const double *weights,
                   const double *bias, const double *sufmax, const double *sufmin) {
    if (n_models >= MAX_MODELS || n_features > MAX_FEATURES || n_classes > MAX_CLASSES) return -1;
    Node *nodes = NULL;
    if (n_nodes > 0) {
        nodes = (Node *)malloc(sizeof(Node) * (size_t)n_nodes);
        if (!nodes) return -1;
        for (int i = 0; i < n_nodes; i++) {
            nodes[i].threshold = threshold[i];
            nodes[i].feature = feature[i];
            nodes[i].left = left[i];
            nodes[i].right = right[i];
            nodes[i].pad = 0;
        }
    }
    /* the kernel owns copies of everything: a model outlives the Python arrays it came from */
    long n_value = kind == 0 ? (long)n_nodes * n_classes : n_nodes;
    long n_bounds = (long)(n_trees + 1) * n_classes;
    Model m = {kind, n_features, n_classes, n_trees, n_num, n_fam, n_suite, nodes,
               copy_array(roots, sizeof(int32_t), n_trees), copy_array(tree_class, sizeof(int32_t), n_trees),
               copy_array(value, sizeof(double), n_value),
               copy_array(weights, sizeof(double), (long)n_classes * n_features),
               copy_array(bias, sizeof(double), n_classes), copy_array(sufmax, sizeof(double), n_bounds),
               copy_array(sufmin, sizeof(double), n_bounds)};
    models[n_models] = m;
    return n_models++;
}

static int argmax(const double *s, int n) {
    int best = 0;
    for (int k = 1; k < n; k++) if (s[k] > s[best]) best = k;
    return best;
}

/* 1 when no remaining tree (from position t on) can change the argmax. */
static int decided(const Model *m, const double *score, int t) {
    int K = m->n_classes, best = argmax(score, K);
    const double *hi = m->sufmax + (long)t * K, *lo = m->sufmin + (long)t * K;
    double floor_best = score[best] + lo[best];
    double margin = 1e-9 * (1.0 + fabs(floor_best));
    for (int k = 0; k < K; k++)
        if (k != best && score[k] + hi[k] >= floor_best - margin) return 0;
    return 1;
}

static int predict_x(const Model *m, const double *x) {
    double score[MAX_CLASSES];
    int K = m->n_classes;
    memset(score, 0, sizeof(double) * K);
    if (m->kind == 2) {
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
        if (K == 1) return score[0] > 0 ? 1 : 0;
        return argmax(score, K);
    }
    const Node *nodes = m->nodes;
    int early = m->sufmax != NULL && K > 1;
    for (int t = 0; t < m->n_trees; t++) {
        if (early && t > 0 && (t % CHECK_EVERY) == 0 && decided(m, score, t)) return argmax(score, K);
        const Node *nd = nodes + m->roots[t];
        if (m->kind == 0) {
            while (nd->left >= 0) {
                float v = (float)x[nd->feature];
                nd = nodes + (v <= nd->threshold ? nd->left : nd->right);
            }
            const double *val = m->value + (long)(nd - nodes) * K;
            for (int k = 0; k < K; k++) score[k] += val[k];
        } else {
            while (nd->left >= 0) nd = nodes + (x[nd->feature] <= nd->threshold ? nd->left : nd->right);
            score[m->tree_class[t]] += m->value[nd - nodes];
        }
    }
    if (m->kind == 0 && m->n_trees > 1)  /* scikit-learn averages the trees' probabilities */
        for (int k = 0; k < K; k++) score[k] /= m->n_trees;
    if (m->kind == 1 && K == 1) return score[0] > 0 ? 1 : 0;
    return argmax(score, K);
}

static void fill_x(const Model *m, double *x, double p, double o, double sp, double cc, double mp,
                   int fam, int suite) {
    x[0] = p; x[1] = o; x[2] = o / (p > 1.0 ? p : 1.0); x[3] = log1p(p); x[4] = log1p(o);
    x[5] = sp; x[6] = cc; x[7] = mp;
    int j = m->n_num;
    for (int k = 0; k < m->n_fam; k++) x[j + k] = (k == fam) ? 1.0 : 0.0;
    j += m->n_fam;
    for (int k = 0; k < m->n_suite; k++) x[j + k] = (k == suite) ? 1.0 : 0.0;
}

int route(int handle, double p, double o, double sp, double cc, double mp, int fam, int suite) {
    const Model *m = &models[handle];
    double x[MAX_FEATURES];
    fill_x(m, x, p, o, sp, cc, mp, fam, suite);
    return predict_x(m, x);
}

void predict_batch(int handle, const double *X, long n, int32_t *out) {
    const Model *m = &models[handle];
    for (long i = 0; i < n; i++) out[i] = predict_x(m, X + i * m->n_features);
}

/* ---------------------------------------------------------------- CPython */
static PyObject *s_p, *s_o, *s_sp, *s_cc, *s_mp, *s_fam, *s_suite, *s_none;

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

/* route_request(handle, classes, fam_index, suite_index, request) -> label */
static PyObject *py_route_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "route_request(handle, classes, fam_index, suite_index, request)");
        return NULL;
    }
    int handle = (int)PyLong_AsLong(args[0]);
    if (handle < 0 || handle >= n_models) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "unknown compiled-router handle");
        return NULL;
    }
    PyObject *req = args[4];
    double p, o, sp, cc, mp;
    if (get_double(req, s_p, &p) || get_double(req, s_o, &o) || get_double(req, s_sp, &sp) ||
        get_double(req, s_cc, &cc) || get_double(req, s_mp, &mp))
        return NULL;
    int fam = get_category(req, s_fam, args[2]);
    int suite = get_category(req, s_suite, args[3]);
    if (fam == -2 || suite == -2) return NULL;
    const Model *m = &models[handle];
    double x[MAX_FEATURES];
    fill_x(m, x, p, o, sp, cc, mp, fam, suite);
    int k = predict_x(m, x);
    PyObject *label = PyTuple_GetItem(args[1], k);
    Py_XINCREF(label);
    return label;
}

static PyMethodDef methods[] = {
    {"route_request", (PyCFunction)(void (*)(void))py_route_request, METH_FASTCALL,
     "One routing decision from a raw request object."},
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
    return PyModule_Create(&module);
}
