//! What every scenario uses: the result type, uploads and downloads of
//! device buffers, the texts of a refused or failed op, numbers from the
//! environment.

use chorus::{DeviceBuffer, DeviceElement, Stream};

pub(super) fn env_num(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub(super) type Res<T> = Result<T, String>;

pub(super) fn up<T: DeviceElement + Copy>(s: &Stream, v: &[T]) -> Res<DeviceBuffer<T>> {
    let slice = s.clone_htod(v).map_err(|e| format!("upload: {e}"))?;
    DeviceBuffer::new(slice).map_err(|e| format!("device buffer: {e}"))
}

pub(super) fn down<T: DeviceElement + Copy>(b: &DeviceBuffer<T>) -> Res<Vec<T>> {
    b.producer()
        .clone_dtoh(b.slice())
        .map_err(|e| format!("download: {e}"))
}

pub(super) fn werr<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> String + '_ {
    move |e| format!("{what}: work failed: {e}")
}

pub(super) fn rej<B>(what: &str) -> impl Fn(chorus::Rejected<B>) -> String + '_ {
    move |e| format!("{what}: rejected: {}", e.error)
}
