/* Compiled steps of mfma.fast_executor's lockstep form (a group of waves at one MFMA): reading the operands
 * from the batch register file and writing the results back, and decoding the FP4 B operand of the f8f6f4
 * forms. Each step gives exactly the values of its numpy form in mfma.py (copies, exact float conversions
 * and exact products), so the results are bitwise the same with or without this library. Built by mfma.py
 * with the system C compiler into .cache/emulator/ on first use (as hip_shim.c is); without one the numpy
 * forms run.
 *
 * An operand source is (base, stride, idx, off): wave k's bytes start at base + idx[k] * stride + off (a
 * register slot of the batch's (slots, registers, 64) uint32 file and a register row times 256 bytes, or a
 * (waves, registers, 64) array with idx = 0, 1, ..., or one constant operand with stride 0). */
#include <stdint.h>
#include <string.h>

#define SRC(base, stride, idx, off, k) ((base) + (idx)[k] * (stride) + (off))

/* 1 when each wave's nbytes equal its kept copy (kept: waves x nbytes), else 0 */
int rows_equal(int nw, const uint8_t *base, long stride, const int64_t *idx, long off, long nbytes,
               const uint8_t *kept)
{
    for (int k = 0; k < nw; k++)
        if (memcmp(SRC(base, stride, idx, off, k), kept + k * nbytes, nbytes))
            return 0;
    return 1;
}

/* out (waves x nbytes) = each wave's nbytes */
void rows_gather(int nw, const uint8_t *base, long stride, const int64_t *idx, long off, long nbytes, uint8_t *out)
{
    for (int k = 0; k < nw; k++)
        memcpy(out + k * nbytes, SRC(base, stride, idx, off, k), nbytes);
}

/* The FP4 B operand (K, N) of each wave as float64 in C order. Registers (nregs, 64 lanes): lane
 * l = g * n_cols + n holds column n, K values 32 g .. 32 g + 31, register r of the lane the values 8 r .. 8 r + 7
 * (low nibble first). Scales (sbase NULL: 1.0): one uint32 register row (64 lanes) per wave, byte `sel` of lane
 * l the E8M0 of its values. lut: the 16 E2M1 values, e8m0: the 256 E8M0 values. Each value is
 * lut[code] * e8m0[scale], exact. out: waves x (32 G) x n_cols doubles, G = 64 / n_cols. */
void fp4_b_operand(int nw, int nregs, int n_cols, const uint8_t *base, long stride, const int64_t *idx, long off,
                   const uint8_t *sbase, long sstride, const int64_t *sidx, long soff, int sel,
                   const double *lut, const double *e8m0, double *out)
{
    int groups = 64 / n_cols;
    long per_wave = (long)32 * groups * n_cols;
    double sv[64];
    for (int k = 0; k < nw; k++) {
        const uint8_t *rw = SRC(base, stride, idx, off, k);
        double *ow = out + k * per_wave;
        if (sbase) {
            const uint8_t *sw = SRC(sbase, sstride, sidx, soff, k) + sel;
            for (int l = 0; l < 64; l++)
                sv[l] = e8m0[sw[4 * l]];
        } else {
            for (int l = 0; l < 64; l++)
                sv[l] = 1.0;
        }
        for (int g = 0; g < groups; g++)
            for (int r = 0; r < nregs; r++)
                for (int b = 0; b < 4; b++) {
                    /* K rows 32 g + 8 r + 2 b (the low nibbles) and the next (the high nibbles) */
                    double *lo = ow + (long)(32 * g + 8 * r + 2 * b) * n_cols, *hi = lo + n_cols;
                    const uint8_t *src = rw + (r * 64 + g * n_cols) * 4 + b;
                    const double *s = sv + g * n_cols;
                    for (int n = 0; n < n_cols; n++) {
                        unsigned x = src[4 * n];
                        lo[n] = lut[x & 15] * s[n];
                        hi[n] = lut[x >> 4] * s[n];
                    }
                }
    }
}

/* The accumulator C of each wave as float64 (M, N) in matrix order: row i of it is the N float32 register
 * values from start[i] on (register r, lane l at r * 64 + l), converted exactly (a NaN quieted as numpy's
 * astype does). out: waves x M x N doubles. */
void f32_to_f64(int nw, int m, int n, const uint8_t *base, long stride, const int64_t *idx, long off,
                const int32_t *start, double *out)
{
    for (int k = 0; k < nw; k++) {
        const float *c = (const float *)SRC(base, stride, idx, off, k);
        double *o = out + (long)k * m * n;
        for (int i = 0; i < m; i++, o += n) {
            const float *ci = c + start[i];
            for (int j = 0; j < n; j++)
                o[j] = (double)ci[j];
        }
    }
}

/* The result D (waves x M x N doubles, matrix order) to each wave's registers as float32: row i to the N
 * register values from start[i] on, rounded to nearest even (as numpy's astype does). */
void f64_to_f32(int nw, int m, int n, const double *d, const int32_t *start, uint8_t *base, long stride,
                const int64_t *idx, long off)
{
    for (int k = 0; k < nw; k++) {
        float *o = (float *)SRC(base, stride, idx, off, k);
        const double *dk = d + (long)k * m * n;
        for (int i = 0; i < m; i++, dk += n) {
            float *oi = o + start[i];
            for (int j = 0; j < n; j++)
                oi[j] = (float)dk[j];
        }
    }
}
