//! The submission loop of the grouped and one-by-one benches.

/// Takes every buffer left in `slots`, submits each with `submit` and
/// keeps what it returns in a vector made to size (`n`), as the raw loops
/// it is compared with keep nothing: the submission loop of the grouped
/// and one-by-one benches.
pub fn submit_each<B, W>(
    slots: &mut [Option<B>],
    n: usize,
    submit: impl FnMut(B) -> Option<W>,
) -> Vec<W> {
    let mut works = Vec::with_capacity(n);
    works.extend(slots.iter_mut().filter_map(Option::take).filter_map(submit));
    works
}
