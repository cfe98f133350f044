//! [`BatchOps`]: the ops of a [`Batch`](crate::Batch) before launch, held
//! by the backend the batch's first op chose (a batch runs on one backend).

use std::fmt;
use std::time::Duration;

use chorus_core::{Op, WorkError};

use super::state::GroupState;
use crate::backend::nccl::NcclStaged;
use crate::backend::tcp::TcpStaged;
use crate::backend::Backend;
use crate::sequence::Sequencer;

/// A batch's staged ops. Its parts are the crate's own; the type is public
/// only because the buffer routing ([`OpBuffer`](crate::OpBuffer)) names
/// it.
#[derive(Default)]
pub struct BatchOps(Staged);

#[derive(Default)]
enum Staged {
    #[default]
    Empty,
    Host(TcpStaged),
    Device(NcclStaged),
}

impl fmt::Debug for BatchOps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchOps")
            .field("backend", &self.backend())
            .field("ops", &self.len())
            .finish()
    }
}

impl BatchOps {
    /// Number of ops staged.
    pub(crate) fn len(&self) -> usize {
        match &self.0 {
            Staged::Empty => 0,
            Staged::Host(s) => s.len(),
            Staged::Device(s) => s.len(),
        }
    }

    /// The backend the staged ops run on (`"none"` before the first).
    pub(crate) fn backend(&self) -> &'static str {
        match &self.0 {
            Staged::Empty => "none",
            Staged::Host(_) => "tcp",
            Staged::Device(_) => "nccl",
        }
    }

    fn wrong_backend(seq: &Sequencer, op: Op, this: &str) -> WorkError {
        seq.invalid(
            op,
            op.name(),
            format!(
                "a batch runs on one backend: its first op took {} buffers, this one {this} \
                 buffers",
                if this == "host" { "device" } else { "host" }
            ),
        )
    }

    /// The host ops staged so far (a batch whose first op is `op` starts
    /// here).
    ///
    /// # Errors
    ///
    /// The batch already holds device ops.
    pub(crate) fn host(&mut self, seq: &Sequencer, op: Op) -> Result<&mut TcpStaged, WorkError> {
        if matches!(self.0, Staged::Empty) {
            self.0 = Staged::Host(TcpStaged::default());
        }
        match &mut self.0 {
            Staged::Host(s) => Ok(s),
            _ => Err(Self::wrong_backend(seq, op, "host")),
        }
    }

    /// The device ops staged so far.
    ///
    /// # Errors
    ///
    /// The batch already holds host ops.
    pub(crate) fn device(&mut self, seq: &Sequencer, op: Op) -> Result<&mut NcclStaged, WorkError> {
        if matches!(self.0, Staged::Empty) {
            self.0 = Staged::Device(NcclStaged::default());
        }
        match &mut self.0 {
            Staged::Device(s) => Ok(s),
            _ => Err(Self::wrong_backend(seq, op, "device")),
        }
    }

    /// Launches the staged ops on their backend as one; an empty batch
    /// launches nothing.
    ///
    /// # Errors
    ///
    /// As [`Backend::launch`].
    pub(crate) fn launch(self, st: &GroupState, timeout: Duration) -> Result<(), WorkError> {
        match self.0 {
            Staged::Empty => Ok(()),
            Staged::Host(s) => st.tcp.launch(&st.seq, timeout, s),
            Staged::Device(s) => st.nccl.launch(&st.seq, timeout, s),
        }
    }
}
