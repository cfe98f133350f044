//! `--share-gpu`: every local rank on one GPU, each claiming a host of its
//! own, so that NCCL builds real communicators of several ranks on a
//! machine with one GPU.
//!
//! NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU
//! detected") when they share the GPU's bus id *and* the host hash; the
//! host hash comes from `NCCL_HOSTID` when it is set. Ranks with distinct
//! `NCCL_HOSTID`s look like ranks on different hosts: NCCL joins them
//! through its socket transport (here on loopback) and their kernels
//! time-share the GPU. The results are the real multi-rank path; the
//! timings say nothing about speed.

/// The variables that put a rank on the shared GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedGpu {
    /// What `CUDA_VISIBLE_DEVICES` becomes: the one GPU every rank sees as
    /// device 0.
    visible: String,
}

/// Marks a rank started with `--share-gpu` (programs that check for one
/// GPU per rank read it).
pub(crate) const SHARE_GPU_VAR: &str = "CHORUS_SHARE_GPU";

impl SharedGpu {
    /// The shared GPU for `--gpu gpu`: that entry of the inherited
    /// `CUDA_VISIBLE_DEVICES` when one is set (so `--gpu 1` under
    /// `CUDA_VISIBLE_DEVICES=4,5` is GPU 5), else device `gpu` itself.
    ///
    /// # Errors
    ///
    /// `gpu` past the end of the inherited list.
    pub(crate) fn new(gpu: u32, inherited: Option<&str>) -> Result<SharedGpu, String> {
        let listed: Vec<&str> = inherited
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let visible = match (inherited, listed.get(gpu as usize)) {
            (None, _) => gpu.to_string(),
            (Some(_), Some(d)) => (*d).to_string(),
            (Some(v), None) => {
                return Err(format!(
                    "--gpu {gpu} is not among the {} GPU(s) of CUDA_VISIBLE_DEVICES={v:?} \
                     (count from 0)",
                    listed.len()
                ))
            }
        };
        Ok(SharedGpu { visible })
    }

    /// The GPU the ranks share, as `CUDA_VISIBLE_DEVICES` names it.
    pub(crate) fn device(&self) -> &str {
        &self.visible
    }

    /// The variables of global rank `rank` (they replace torchrun's
    /// `LOCAL_RANK`, which programs take for their device).
    pub(crate) fn rank_env(&self, rank: u32) -> Vec<(&'static str, String)> {
        vec![
            ("CUDA_VISIBLE_DEVICES", self.visible.clone()),
            ("LOCAL_RANK", "0".to_string()),
            // A host of its own for NCCL: distinct per rank of the job.
            ("NCCL_HOSTID", format!("chorus-shared-gpu-rank{rank}")),
            // The "hosts" are one: NCCL's sockets go over loopback, and
            // no InfiniBand device is looked for.
            ("NCCL_SOCKET_IFNAME", "lo".to_string()),
            ("NCCL_IB_DISABLE", "1".to_string()),
            (SHARE_GPU_VAR, "1".to_string()),
        ]
    }

    /// The line chorus-run prints before it starts `nproc` ranks.
    pub(crate) fn warning(&self, nproc: u32) -> String {
        format!(
            "--share-gpu: {nproc} ranks share GPU {} (CUDA_VISIBLE_DEVICES={0}, each rank its own \
             NCCL_HOSTID, NCCL over sockets on loopback): results are real, timings mean nothing \
             about speed",
            self.device()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(env: &[(&'static str, String)], k: &str) -> String {
        env.iter().find(|(n, _)| *n == k).unwrap().1.clone()
    }

    #[test]
    fn every_rank_sees_one_gpu_as_device_0_and_claims_its_own_host() {
        let s = SharedGpu::new(0, None).unwrap();
        let (a, b) = (s.rank_env(0), s.rank_env(3));
        for env in [&a, &b] {
            assert_eq!(get(env, "CUDA_VISIBLE_DEVICES"), "0");
            assert_eq!(get(env, "LOCAL_RANK"), "0");
            assert_eq!(get(env, "NCCL_SOCKET_IFNAME"), "lo");
            assert_eq!(get(env, "NCCL_IB_DISABLE"), "1");
            assert_eq!(get(env, SHARE_GPU_VAR), "1");
        }
        assert_ne!(get(&a, "NCCL_HOSTID"), get(&b, "NCCL_HOSTID"));
        assert!(s.warning(4).contains("timings mean nothing"));
    }

    #[test]
    fn gpu_picks_from_the_inherited_visible_devices() {
        assert_eq!(SharedGpu::new(2, None).unwrap().device(), "2");
        assert_eq!(SharedGpu::new(1, Some("4,5")).unwrap().device(), "5");
        let uuid = "GPU-8d1c3e2a-0000-0000-0000-000000000000";
        assert_eq!(SharedGpu::new(0, Some(uuid)).unwrap().device(), uuid);
        let e = SharedGpu::new(2, Some("4,5")).unwrap_err();
        assert!(e.contains("--gpu 2") && e.contains("2 GPU(s)"), "{e}");
        // An empty list hides every GPU: nothing to pick.
        assert!(SharedGpu::new(0, Some("")).is_err());
    }
}
