//! The trainer's element-wise kernels, as PTX text (sm_70 and later; the
//! driver compiles it for the GPU at load time, no nvcc or NVRTC needed).
//!
//! One thread per element, bounds-checked, except the two reductions
//! (`tr_mse`, `tr_hash`), which loop over the elements with a grid stride,
//! reduce each warp with `shfl.sync`, and let lane 0 add (or xor) the
//! warp's value into one word of global memory. Launch every kernel with
//! blocks of [`BLOCK`] threads (a multiple of 32, which the warp
//! reductions need).

/// Threads per block of every launch.
pub const BLOCK: u32 = 256;

/// Most blocks of a grid-stride (reduction) kernel.
pub const MAX_REDUCE_BLOCKS: u32 = 1024;

/// The kernels' names, as [`PTX`] spells them.
pub const KERNEL_NAMES: [&str; 6] = [
    "tr_bias_act",
    "tr_relu_bwd",
    "tr_col_sum",
    "tr_mse",
    "tr_sgd",
    "tr_hash",
];

/// The module:
///
/// * `tr_bias_act(y, bias, n, width, relu)`: `y[i] += bias[i % width]`,
///   then `y[i] = max(y[i], 0)` if `relu != 0`.
/// * `tr_relu_bwd(d, a, n)`: `d[i] = a[i] > 0 ? d[i] : 0` (`a` is the
///   ReLU's output).
/// * `tr_col_sum(d, out, rows, width)`: `out[o] = Σ_b d[b·width + o]`,
///   summed in row order (one thread per column).
/// * `tr_mse(pred, y, d, n, scale, loss)`: `e = pred[i] - y[i]`,
///   `d[i] = scale·e`, and `*loss += Σ e²` (atomically, one add per warp).
/// * `tr_sgd(p, g, n, lr)`: `p[i] = p[i] - lr·g[i]` (one fused
///   multiply-add).
/// * `tr_hash(p, n, out)`: `*out ^= ⊕_i mix(i << 32 | bits(p[i]))`, an
///   order-independent 64-bit hash of the values and their positions
///   (splitmix64's finalizer with constants below 2⁶³).
pub const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry tr_bias_act(.param .u64 y, .param .u64 bias, .param .u32 n, .param .u32 width, .param .u32 relu)
{
    .reg .pred %p<3>;
    .reg .u32 %r<9>;
    .reg .u64 %rd<7>;
    .reg .f32 %f<3>;
    ld.param.u64 %rd1, [y];
    ld.param.u64 %rd2, [bias];
    ld.param.u32 %r1, [n];
    ld.param.u32 %r2, [width];
    ld.param.u32 %r3, [relu];
    mov.u32 %r4, %ctaid.x;
    mov.u32 %r5, %ntid.x;
    mov.u32 %r6, %tid.x;
    mad.lo.u32 %r7, %r4, %r5, %r6;
    setp.ge.u32 %p1, %r7, %r1;
    @%p1 bra BA_DONE;
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mul.wide.u32 %rd3, %r7, 4;
    add.u64 %rd4, %rd1, %rd3;
    rem.u32 %r8, %r7, %r2;
    mul.wide.u32 %rd5, %r8, 4;
    add.u64 %rd6, %rd2, %rd5;
    ld.global.f32 %f1, [%rd4];
    ld.global.f32 %f2, [%rd6];
    add.f32 %f1, %f1, %f2;
    setp.ne.u32 %p2, %r3, 0;
    @%p2 max.f32 %f1, %f1, 0f00000000;
    st.global.f32 [%rd4], %f1;
BA_DONE:
    ret;
}

.visible .entry tr_relu_bwd(.param .u64 d, .param .u64 a, .param .u32 n)
{
    .reg .pred %p<3>;
    .reg .u32 %r<6>;
    .reg .u64 %rd<6>;
    .reg .f32 %f<4>;
    ld.param.u64 %rd1, [d];
    ld.param.u64 %rd2, [a];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra RB_DONE;
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mul.wide.u32 %rd3, %r5, 4;
    add.u64 %rd4, %rd1, %rd3;
    add.u64 %rd5, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
    ld.global.f32 %f2, [%rd5];
    setp.gt.f32 %p2, %f2, 0f00000000;
    selp.f32 %f3, %f1, 0f00000000, %p2;
    st.global.f32 [%rd4], %f3;
RB_DONE:
    ret;
}

.visible .entry tr_col_sum(.param .u64 d, .param .u64 out, .param .u32 rows, .param .u32 width)
{
    .reg .pred %p<4>;
    .reg .u32 %r<8>;
    .reg .u64 %rd<8>;
    .reg .f32 %f<3>;
    ld.param.u64 %rd1, [d];
    ld.param.u64 %rd2, [out];
    ld.param.u32 %r1, [rows];
    ld.param.u32 %r2, [width];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.u32 %r6, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r6, %r2;
    @%p1 bra CS_DONE;
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mul.wide.u32 %rd3, %r6, 4;
    add.u64 %rd4, %rd1, %rd3;
    mul.wide.u32 %rd5, %r2, 4;
    mov.f32 %f1, 0f00000000;
    mov.u32 %r7, 0;
    setp.eq.u32 %p2, %r1, 0;
    @%p2 bra CS_STORE;
CS_LOOP:
    ld.global.f32 %f2, [%rd4];
    add.f32 %f1, %f1, %f2;
    add.u64 %rd4, %rd4, %rd5;
    add.u32 %r7, %r7, 1;
    setp.lt.u32 %p3, %r7, %r1;
    @%p3 bra CS_LOOP;
CS_STORE:
    add.u64 %rd6, %rd2, %rd3;
    st.global.f32 [%rd6], %f1;
CS_DONE:
    ret;
}

.visible .entry tr_mse(.param .u64 pred, .param .u64 y, .param .u64 d, .param .u32 n, .param .f32 scale, .param .u64 loss)
{
    .reg .pred %p<3>;
    .reg .u32 %r<10>;
    .reg .u64 %rd<10>;
    .reg .f32 %f<8>;
    .reg .b32 %b<3>;
    ld.param.u64 %rd1, [pred];
    ld.param.u64 %rd2, [y];
    ld.param.u64 %rd3, [d];
    ld.param.u32 %r1, [n];
    ld.param.f32 %f1, [scale];
    ld.param.u64 %rd4, [loss];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    cvta.to.global.u64 %rd3, %rd3;
    cvta.to.global.u64 %rd4, %rd4;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    mov.u32 %r6, %nctaid.x;
    mul.lo.u32 %r6, %r6, %r3;
    mov.f32 %f2, 0f00000000;
MS_LOOP:
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra MS_REDUCE;
    mul.wide.u32 %rd5, %r5, 4;
    add.u64 %rd6, %rd1, %rd5;
    add.u64 %rd7, %rd2, %rd5;
    add.u64 %rd8, %rd3, %rd5;
    ld.global.f32 %f3, [%rd6];
    ld.global.f32 %f4, [%rd7];
    sub.f32 %f5, %f3, %f4;
    mul.f32 %f6, %f5, %f1;
    st.global.f32 [%rd8], %f6;
    fma.rn.f32 %f2, %f5, %f5, %f2;
    add.u32 %r5, %r5, %r6;
    bra MS_LOOP;
MS_REDUCE:
    mov.b32 %b1, %f2;
    shfl.sync.down.b32 %b2, %b1, 16, 31, -1;
    mov.b32 %f7, %b2;
    add.f32 %f2, %f2, %f7;
    mov.b32 %b1, %f2;
    shfl.sync.down.b32 %b2, %b1, 8, 31, -1;
    mov.b32 %f7, %b2;
    add.f32 %f2, %f2, %f7;
    mov.b32 %b1, %f2;
    shfl.sync.down.b32 %b2, %b1, 4, 31, -1;
    mov.b32 %f7, %b2;
    add.f32 %f2, %f2, %f7;
    mov.b32 %b1, %f2;
    shfl.sync.down.b32 %b2, %b1, 2, 31, -1;
    mov.b32 %f7, %b2;
    add.f32 %f2, %f2, %f7;
    mov.b32 %b1, %f2;
    shfl.sync.down.b32 %b2, %b1, 1, 31, -1;
    mov.b32 %f7, %b2;
    add.f32 %f2, %f2, %f7;
    and.b32 %r9, %r4, 31;
    setp.ne.u32 %p2, %r9, 0;
    @%p2 bra MS_DONE;
    red.global.add.f32 [%rd4], %f2;
MS_DONE:
    ret;
}

.visible .entry tr_sgd(.param .u64 p, .param .u64 g, .param .u32 n, .param .f32 lr)
{
    .reg .pred %p<2>;
    .reg .u32 %r<6>;
    .reg .u64 %rd<6>;
    .reg .f32 %f<5>;
    ld.param.u64 %rd1, [p];
    ld.param.u64 %rd2, [g];
    ld.param.u32 %r1, [n];
    ld.param.f32 %f1, [lr];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra SG_DONE;
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mul.wide.u32 %rd3, %r5, 4;
    add.u64 %rd4, %rd1, %rd3;
    add.u64 %rd5, %rd2, %rd3;
    ld.global.f32 %f2, [%rd4];
    ld.global.f32 %f3, [%rd5];
    neg.f32 %f4, %f1;
    fma.rn.f32 %f2, %f4, %f3, %f2;
    st.global.f32 [%rd4], %f2;
SG_DONE:
    ret;
}

.visible .entry tr_hash(.param .u64 p, .param .u32 n, .param .u64 out)
{
    .reg .pred %p<3>;
    .reg .u32 %r<14>;
    .reg .u64 %rd<10>;
    .reg .b32 %h<5>;
    .reg .b64 %hd<3>;
    ld.param.u64 %rd1, [p];
    ld.param.u32 %r1, [n];
    ld.param.u64 %rd2, [out];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    mov.u32 %r6, %nctaid.x;
    mul.lo.u32 %r6, %r6, %r3;
    mov.u64 %rd3, 0;
HS_LOOP:
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra HS_REDUCE;
    mul.wide.u32 %rd4, %r5, 4;
    add.u64 %rd5, %rd1, %rd4;
    ld.global.u32 %r7, [%rd5];
    cvt.u64.u32 %rd6, %r5;
    shl.b64 %rd6, %rd6, 32;
    cvt.u64.u32 %rd7, %r7;
    or.b64 %rd6, %rd6, %rd7;
    add.u64 %rd6, %rd6, 2177006035548880917;
    shr.u64 %rd7, %rd6, 30;
    xor.b64 %rd6, %rd6, %rd7;
    mul.lo.u64 %rd6, %rd6, 4564873003316004281;
    shr.u64 %rd7, %rd6, 27;
    xor.b64 %rd6, %rd6, %rd7;
    mul.lo.u64 %rd6, %rd6, 1499310498698563051;
    shr.u64 %rd7, %rd6, 31;
    xor.b64 %rd6, %rd6, %rd7;
    xor.b64 %rd3, %rd3, %rd6;
    add.u32 %r5, %r5, %r6;
    bra HS_LOOP;
HS_REDUCE:
    mov.b64 %hd1, %rd3;
    mov.b64 {%h1, %h2}, %hd1;
    shfl.sync.bfly.b32 %h3, %h1, 16, 31, -1;
    shfl.sync.bfly.b32 %h4, %h2, 16, 31, -1;
    xor.b32 %h1, %h1, %h3;
    xor.b32 %h2, %h2, %h4;
    shfl.sync.bfly.b32 %h3, %h1, 8, 31, -1;
    shfl.sync.bfly.b32 %h4, %h2, 8, 31, -1;
    xor.b32 %h1, %h1, %h3;
    xor.b32 %h2, %h2, %h4;
    shfl.sync.bfly.b32 %h3, %h1, 4, 31, -1;
    shfl.sync.bfly.b32 %h4, %h2, 4, 31, -1;
    xor.b32 %h1, %h1, %h3;
    xor.b32 %h2, %h2, %h4;
    shfl.sync.bfly.b32 %h3, %h1, 2, 31, -1;
    shfl.sync.bfly.b32 %h4, %h2, 2, 31, -1;
    xor.b32 %h1, %h1, %h3;
    xor.b32 %h2, %h2, %h4;
    shfl.sync.bfly.b32 %h3, %h1, 1, 31, -1;
    shfl.sync.bfly.b32 %h4, %h2, 1, 31, -1;
    xor.b32 %h1, %h1, %h3;
    xor.b32 %h2, %h2, %h4;
    mov.b64 %hd2, {%h1, %h2};
    and.b32 %r12, %r4, 31;
    setp.ne.u32 %p2, %r12, 0;
    @%p2 bra HS_DONE;
    red.global.xor.b64 [%rd2], %hd2;
HS_DONE:
    ret;
}
"#;

/// The host mirror of `tr_hash` for one value (tests and the CPU
/// reference's hash use it).
pub fn hash_term(i: u32, bits: u32) -> u64 {
    let mut z = ((i as u64) << 32 | bits as u64).wrapping_add(2_177_006_035_548_880_917);
    z = (z ^ (z >> 30)).wrapping_mul(4_564_873_003_316_004_281);
    z = (z ^ (z >> 27)).wrapping_mul(1_499_310_498_698_563_051);
    z ^ (z >> 31)
}

/// The host mirror of `tr_hash` over a slice.
pub fn hash_params(p: &[f32]) -> u64 {
    p.iter()
        .enumerate()
        .fold(0, |h, (i, v)| h ^ hash_term(i as u32, v.to_bits()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_in_the_module_and_braces_balance() {
        for name in KERNEL_NAMES {
            assert!(PTX.contains(&format!(".visible .entry {name}(")), "{name}");
        }
        let open = PTX.matches('{').count();
        let close = PTX.matches('}').count();
        assert_eq!(open, close);
        assert!(PTX.is_ascii());
    }

    #[test]
    fn hash_constants_fit_a_signed_ptx_literal() {
        for c in [
            2_177_006_035_548_880_917u64,
            4_564_873_003_316_004_281,
            1_499_310_498_698_563_051,
        ] {
            assert!(c < 1 << 63);
        }
    }

    #[test]
    fn the_hash_sees_one_flipped_bit_and_a_swap() {
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let mut b = a;
        b[2] = f32::from_bits(b[2].to_bits() ^ 1);
        assert_ne!(hash_params(&a), hash_params(&b));
        let c = [2.0f32, 1.0, 3.0, 4.0];
        assert_ne!(hash_params(&a), hash_params(&c));
    }
}
