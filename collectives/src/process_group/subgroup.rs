//! Subgroups: [`ProcessGroup::new_group`].

use std::sync::atomic::Ordering;

use super::builder::{connect, Setup};
use super::process_group::ProcessGroup;
use crate::backend::nccl;
use crate::error::Error;
use chorus_core::sync::lock;

impl ProcessGroup {
    /// Creates a subgroup of the given world ranks (in that order).
    ///
    /// Every rank of this group must call it, with the same list, in the same
    /// order relative to other `new_group` calls (as in c10d). Ranks in the
    /// list get `Some(group)`; the others get `None`. The subgroup has its
    /// own store prefix, sequence numbers and connections.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty list, a duplicate or a rank
    /// outside this group; setup errors as for the world group.
    pub async fn new_group(&self, ranks: &[usize]) -> Result<Option<ProcessGroup>, Error> {
        let g = &self.inner;
        let name = g.seq.name();
        if ranks.is_empty() {
            return Err(Error::InvalidArgument(
                "new_group needs at least one rank".into(),
            ));
        }
        let mut seen = vec![false; g.seq.size()];
        for &r in ranks {
            match g.members.iter().position(|&m| m == r) {
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "rank {r} is not a member of group '{name}' (members: {:?})",
                        g.members
                    )))
                }
                Some(i) if seen[i] => {
                    return Err(Error::InvalidArgument(format!(
                        "rank {r} appears twice in new_group({ranks:?})"
                    )))
                }
                Some(i) => seen[i] = true,
            }
        }
        // Counted only once the call is valid, so every rank numbers its
        // subgroups the same way.
        let k = g.subgroups.fetch_add(1, Ordering::SeqCst) + 1;
        let me = g.members[g.seq.rank()];
        let sub_rank = ranks.iter().position(|&r| r == me);
        // Split the parent's NCCL communicator where one exists: every rank
        // of the parent takes part, those outside with no colour.
        let split = match g.nccl.collective_comm() {
            Some(parent) => {
                let dev = parent.device().ordinal() as u32;
                nccl::split(parent, sub_rank, ranks.len(), g.nccl_opts, g.timeout)
                    .await
                    .map_err(|e| Error::Setup {
                        group: format!("{name}/{k}"),
                        rank: g.seq.rank(),
                        msg: format!("splitting the parent's NCCL communicator failed: {e}"),
                    })?
                    .map(|c| (dev, c))
            }
            None => None,
        };
        let Some(sub_rank) = sub_rank else {
            return Ok(None);
        };
        let sub_name: std::sync::Arc<str> = format!("{name}/{k}").into();
        let group = connect(Setup {
            base: sub_name.clone(),
            epoch: 0,
            name: sub_name,
            rank: sub_rank,
            members: ranks.to_vec(),
            root_store: g.root_store.clone(),
            timeout: g.timeout,
            tcp: g.tcp_opts.clone(),
            policy: g.policy,
            nccl: g.nccl_opts,
            propagate: g.propagation.is_some(),
            liveness: g.liveness,
            check_ops: g.check_ops,
            admit_first: false,
            origin: g.origin,
        })
        .await?;
        lock(&g.children).push(std::sync::Arc::downgrade(&group.inner));
        if let Some((dev, comm)) = split {
            group.inner.nccl.preset(dev, comm);
            group.init_device(dev as usize).await?;
        }
        Ok(Some(group))
    }
}
