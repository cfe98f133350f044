//! The report: `header` (the machine, the command, the date), `store`,
//! `tcp` and `nccl` (each comparison's sections), `file` (the report's
//! place between the markers of its file).

mod file;
mod header;
mod nccl;
mod store;
mod tcp;

pub(crate) use file::{relative, splice};
#[cfg(test)]
pub(crate) use file::{BEGIN, END};
pub(crate) use header::{machine, shell_quote, utc_now};
pub(crate) use nccl::{groups_section, nccl_section, raw_section};
pub(crate) use store::store_section;
pub(crate) use tcp::tcp_section;
