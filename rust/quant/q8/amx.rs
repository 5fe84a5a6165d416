//! Intel AMX for the block-total kernels' batches (`sums`): one `tdpbssd`
//! totals a block of 32 signed codes of 16 weight rows against 8 activation
//! rows (128 exact int32 totals, 4096 byte products), so a batch's integer
//! work leaves the vector units, which keep the portable float operations
//! (`acc = acc + (scale * d) * float(total)` block by block, the same bits).
//!
//! Used where the CPU has AMX-TILE and AMX-INT8 (Sapphire Rapids and later
//! Xeons) and Linux grants the process the tile data state
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`); `RLX_AMX=0` turns it off. Stable
//! Rust has no AMX intrinsics, so the five instructions are inline
//! assembly.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Whether AMX runs here (checked once: CPUID, the kernel's permission,
/// the OS-enabled state in XCR0, and `RLX_AMX`).
pub(super) fn available() -> bool {
    static AMX: OnceLock<bool> = OnceLock::new();
    *AMX.get_or_init(|| {
        if std::env::var("RLX_AMX").is_ok_and(|v| v.trim() == "0") {
            return false;
        }
        let leaf = __cpuid_count(7, 0);
        let (tile, int8) = (leaf.edx >> 24 & 1 == 1, leaf.edx >> 25 & 1 == 1);
        if !(tile && int8 && std::arch::is_x86_feature_detected!("xsave")) {
            return false;
        }
        // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
        const ARCH_PRCTL: i64 = 158;
        const REQ_XCOMP_PERM: i64 = 0x1023;
        const XTILEDATA: i64 = 18;
        let ret: i64;
        // SAFETY: a Linux syscall with integer arguments; it writes no memory.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") ARCH_PRCTL => ret,
                in("rdi") REQ_XCOMP_PERM,
                in("rsi") XTILEDATA,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        if ret != 0 {
            return false;
        }
        // XCR0 bits 17 (tile config) and 18 (tile data): enabled by the OS.
        // SAFETY: XSAVE (so XGETBV) present, checked above.
        let xcr0 = unsafe { xgetbv0() };
        xcr0 & (3 << 17) == 3 << 17
    })
}

/// XCR0.
///
/// # Safety
/// XSAVE present.
#[target_feature(enable = "xsave")]
unsafe fn xgetbv0() -> u64 {
    // SAFETY: forwarded.
    unsafe { _xgetbv(0) }
}

/// The tile configuration: tmm0 = 16 weight rows x 32 codes, tmm1 = the
/// activations' block in VNNI order (8 quarters x 8 rows x 4 codes),
/// tmm2 and tmm3 = 16 x 8 int32 totals (alternate blocks, so one block's
/// totals are stored while the next one's are summed).
#[repr(C, align(64))]
struct Config([u8; 64]);

/// Loads the configuration on this thread; [`release`] when done.
///
/// # Safety
/// [`available`] returned true.
pub(super) unsafe fn configure() {
    let mut cfg = Config([0; 64]);
    cfg.0[0] = 1;
    for (t, rows, colsb) in [(0usize, 16u8, 32u16), (1, 8, 32), (2, 16, 32), (3, 16, 32)] {
        cfg.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
        cfg.0[48 + t] = rows;
    }
    // SAFETY: AMX available and permitted; the configuration is 64 bytes.
    unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
}

/// Returns the tile state to init (the configuration gone).
///
/// # Safety
/// [`available`] returned true.
pub(super) unsafe fn release() {
    // SAFETY: AMX available.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// `totals[i][m] = sum_j w[i][j] * x[m][j]` over one block of 32 signed
/// codes: `w` 16 rows `stride` bytes apart, `xb` the block's 256 bytes in
/// VNNI order (quarter `q` of row `m` at `32 q + 4 m`), `totals` 16 x 8;
/// in tmm2 (`ODD` false) or tmm3.
///
/// # Safety
/// [`configure`] ran on this thread; 32 readable bytes at each of
/// `w + i * stride`, 256 at `xb`, 512 writable at `totals`.
#[inline(always)]
pub(super) unsafe fn block<const ODD: bool>(
    w: *const i8,
    stride: usize,
    xb: *const i8,
    totals: *mut i32,
) {
    macro_rules! block_in {
        ($tmm:literal) => {
            // SAFETY: forwarded; the tiles are the configured shapes.
            unsafe {
                asm!(
                    concat!("tilezero ", $tmm),
                    "tileloadd tmm0, [{w} + {ws} * 1]",
                    "tileloadd tmm1, [{x} + {xs} * 1]",
                    concat!("tdpbssd ", $tmm, ", tmm0, tmm1"),
                    concat!("tilestored [{t} + {ts} * 1], ", $tmm),
                    w = in(reg) w,
                    ws = in(reg) stride,
                    x = in(reg) xb,
                    xs = in(reg) 32usize,
                    t = in(reg) totals,
                    ts = in(reg) 32usize,
                    options(nostack),
                )
            }
        };
    }
    if ODD {
        block_in!("tmm3")
    } else {
        block_in!("tmm2")
    }
}
