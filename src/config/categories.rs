//! Atrace categories on Linux: the kernel events a category word stands for
//! (`sched`, `freq`, `idle`, …), as Perfetto's `traced_probes` adds them for
//! an `atrace_categories` entry on Linux, where there is no atrace to run.
//!
//! Facts of Perfetto v58 (its table of predefined tracepoints; a group it
//! adds whole stands here for the events of that group its event table
//! knows). As there, each event is enabled only where the kernel has it, and
//! one it lacks is not reported as unknown; `atrace_userspace_only` adds
//! none of them. One difference: for `memory`, Perfetto makes a synthetic,
//! throttled `rss_stat` where the kernel can; recorder names `kmem/rss_stat`
//! (`throttle_rss_stat` chooses the throttled form).
//!
//! Categories Android's atrace knows beside these (`am`, `view`, `wm`, …)
//! are userspace ones: on Linux they add only `ftrace/print`.

/// One category: its word, what it covers, the events it adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Category {
    /// The word (`sched`).
    pub name: &'static str,
    /// What it covers, for people.
    pub about: &'static str,
    /// `group/name` of each event it adds where the kernel has it.
    pub events: &'static [&'static str],
}

/// Every category that adds kernel events on Linux, by name.
pub(crate) const CATEGORIES: &[Category] = &[
    Category {
        name: "binder_driver",
        about: "Android binder transactions",
        events: &[
            "binder/binder_set_priority",
            "binder/binder_transaction",
            "binder/binder_transaction_alloc_buf",
            "binder/binder_transaction_received",
        ],
    },
    Category {
        name: "binder_lock",
        about: "Android binder's global lock (old kernels)",
        events: &[
            "binder/binder_lock",
            "binder/binder_locked",
            "binder/binder_unlock",
        ],
    },
    Category {
        name: "camera",
        about: "camera hardware (lwis)",
        events: &["lwis/tracing_mark_write"],
    },
    Category {
        name: "disk",
        about: "filesystem syncs and writes, block I/O",
        events: &[
            "block/block_bio_complete",
            "block/block_bio_queue",
            "ext4/ext4_da_write_begin",
            "ext4/ext4_da_write_end",
            "ext4/ext4_sync_file_enter",
            "ext4/ext4_sync_file_exit",
            "f2fs/f2fs_iostat",
            "f2fs/f2fs_iostat_latency",
            "f2fs/f2fs_sync_file_enter",
            "f2fs/f2fs_sync_file_exit",
            "f2fs/f2fs_write_begin",
            "f2fs/f2fs_write_end",
            "ufs/ufshcd_command",
        ],
    },
    Category {
        name: "freq",
        about: "CPU and GPU frequency, clocks, suspend, CPU hotplug",
        events: &[
            "clk/clk_disable",
            "clk/clk_enable",
            "clk/clk_set_rate",
            "cpuhp/cpuhp_enter",
            "cpuhp/cpuhp_exit",
            "cpuhp/cpuhp_pause",
            "msm_bus/bus_agg_bw",
            "msm_bus/bus_avail_bw",
            "msm_bus/bus_bimc_config_limiter",
            "msm_bus/bus_bke_params",
            "msm_bus/bus_client_status",
            "msm_bus/bus_max_votes",
            "msm_bus/bus_rules_matches",
            "msm_bus/bus_update_request",
            "msm_bus/bus_update_request_end",
            "power/clock_disable",
            "power/clock_enable",
            "power/clock_set_rate",
            "power/cpu_frequency",
            "power/cpu_frequency_limits",
            "power/gpu_frequency",
            "power/suspend_resume",
        ],
    },
    Category {
        name: "gfx",
        about: "display and GPU drivers (mdss, mali, sde, dpu, g2d, panel)",
        events: &[
            "dpu/disp_dpu_line_underrun",
            "dpu/disp_dpu_underrun",
            "dpu/disp_frame_done_missing",
            "dpu/disp_frame_done_timeout",
            "dpu/disp_frame_start_missing",
            "dpu/disp_frame_start_timeout",
            "dpu/disp_vblank_irq_enable",
            "dpu/dsi_cmd_fifo_status",
            "dpu/dsi_rx",
            "dpu/dsi_tx",
            "dpu/tracing_mark_write",
            "g2d/g2d_counter",
            "g2d/g2d_perf_update_qos",
            "g2d/g2d_slice_instant",
            "g2d/tracing_mark_write",
            "mali/gpu_power_state",
            "mali/mali_CSF_INTERRUPT_END",
            "mali/mali_CSF_INTERRUPT_START",
            "mali/mali_KCPU_CQS_SET",
            "mali/mali_KCPU_CQS_WAIT_END",
            "mali/mali_KCPU_CQS_WAIT_START",
            "mali/mali_KCPU_FENCE_SIGNAL",
            "mali/mali_KCPU_FENCE_WAIT_END",
            "mali/mali_KCPU_FENCE_WAIT_START",
            "mali/mali_PM_MCU_HCTL_CORES_DOWN_SCALE_NOTIFY_PEND",
            "mali/mali_PM_MCU_HCTL_CORES_NOTIFY_PEND",
            "mali/mali_PM_MCU_HCTL_CORE_INACTIVE_PEND",
            "mali/mali_PM_MCU_HCTL_MCU_ON_RECHECK",
            "mali/mali_PM_MCU_HCTL_SHADERS_CORE_OFF_PEND",
            "mali/mali_PM_MCU_HCTL_SHADERS_PEND_OFF",
            "mali/mali_PM_MCU_HCTL_SHADERS_PEND_ON",
            "mali/mali_PM_MCU_HCTL_SHADERS_READY_OFF",
            "mali/mali_PM_MCU_IN_SLEEP",
            "mali/mali_PM_MCU_OFF",
            "mali/mali_PM_MCU_ON",
            "mali/mali_PM_MCU_ON_CORE_ATTR_UPDATE_PEND",
            "mali/mali_PM_MCU_ON_GLB_REINIT_PEND",
            "mali/mali_PM_MCU_ON_HALT",
            "mali/mali_PM_MCU_ON_HWCNT_DISABLE",
            "mali/mali_PM_MCU_ON_HWCNT_ENABLE",
            "mali/mali_PM_MCU_ON_PEND_HALT",
            "mali/mali_PM_MCU_ON_PEND_SLEEP",
            "mali/mali_PM_MCU_ON_SLEEP_INITIATE",
            "mali/mali_PM_MCU_PEND_OFF",
            "mali/mali_PM_MCU_PEND_ON_RELOAD",
            "mali/mali_PM_MCU_POWER_DOWN",
            "mali/mali_PM_MCU_RESET_WAIT",
            "mali/tracing_mark_write",
            "mdss/mdp_cmd_kickoff",
            "mdss/mdp_cmd_pingpong_done",
            "mdss/mdp_cmd_readptr_done",
            "mdss/mdp_cmd_release_bw",
            "mdss/mdp_cmd_wait_pingpong",
            "mdss/mdp_commit",
            "mdss/mdp_compare_bw",
            "mdss/mdp_misr_crc",
            "mdss/mdp_mixer_update",
            "mdss/mdp_perf_prefill_calc",
            "mdss/mdp_perf_set_ot",
            "mdss/mdp_perf_set_panic_luts",
            "mdss/mdp_perf_set_qos_luts",
            "mdss/mdp_perf_set_wm_levels",
            "mdss/mdp_perf_update_bus",
            "mdss/mdp_sspp_change",
            "mdss/mdp_sspp_set",
            "mdss/mdp_trace_counter",
            "mdss/mdp_video_underrun_done",
            "mdss/rotator_bw_ao_as_context",
            "mdss/tracing_mark_write",
            "panel/dsi_cmd_fifo_status",
            "panel/dsi_rx",
            "panel/dsi_tx",
            "panel/gram_collision",
            "panel/panel_settings_full",
            "panel/panel_settings_lite",
            "panel/panel_write_generic",
            "sde/sde_cmd_release_bw",
            "sde/sde_encoder_underrun",
            "sde/sde_evtlog",
            "sde/sde_perf_calc_crtc",
            "sde/sde_perf_crtc_update",
            "sde/sde_perf_set_danger_luts",
            "sde/sde_perf_set_ot",
            "sde/sde_perf_set_qos_luts",
            "sde/sde_perf_update_bus",
            "sde/tracing_mark_write",
        ],
    },
    Category {
        name: "i2c",
        about: "I2C and SMBus transfers",
        events: &[
            "i2c/i2c_read",
            "i2c/i2c_reply",
            "i2c/i2c_result",
            "i2c/i2c_write",
            "i2c/smbus_read",
            "i2c/smbus_reply",
            "i2c/smbus_result",
            "i2c/smbus_write",
        ],
    },
    Category {
        name: "idle",
        about: "CPU idle states",
        events: &["power/cpu_idle"],
    },
    Category {
        name: "ion",
        about: "ION allocations",
        events: &["kmem/ion_alloc_buffer_start"],
    },
    Category {
        name: "irq",
        about: "hard and soft interrupts, IPIs",
        events: &[
            "ipi/ipi_entry",
            "ipi/ipi_exit",
            "ipi/ipi_raise",
            "irq/irq_handler_entry",
            "irq/irq_handler_exit",
            "irq/softirq_entry",
            "irq/softirq_exit",
            "irq/softirq_raise",
            "irq/tasklet_entry",
            "irq/tasklet_exit",
            "irq/tasklet_hi_entry",
            "irq/tasklet_hi_exit",
        ],
    },
    Category {
        name: "irqoff",
        about: "interrupts disabled (preemptirq)",
        events: &["preemptirq/irq_disable", "preemptirq/irq_enable"],
    },
    Category {
        name: "load",
        about: "cpufreq_interactive governor (no events in Perfetto's table)",
        events: &[],
    },
    Category {
        name: "membus",
        about: "memory bus (no events in Perfetto's table)",
        events: &[],
    },
    Category {
        name: "memory",
        about: "RSS, ION, DMA-BUF and GPU memory counters",
        events: &[
            "dmabuf_heap/dma_heap_stat",
            "gpu_mem/gpu_mem_total",
            "ion/ion_stat",
            "kmem/ion_heap_grow",
            "kmem/ion_heap_shrink",
            "kmem/rss_stat",
            "mm_event/mm_event_record",
        ],
    },
    Category {
        name: "memreclaim",
        about: "direct reclaim, kswapd, low-memory kills",
        events: &[
            "lowmemorykiller/lowmemory_kill",
            "vmscan/mm_vmscan_direct_reclaim_begin",
            "vmscan/mm_vmscan_direct_reclaim_end",
            "vmscan/mm_vmscan_kswapd_sleep",
            "vmscan/mm_vmscan_kswapd_wake",
            "vmscan/mm_vmscan_memcg_reclaim_begin",
            "vmscan/mm_vmscan_memcg_reclaim_end",
        ],
    },
    Category {
        name: "mmc",
        about: "MMC storage (no events in Perfetto's table)",
        events: &[],
    },
    Category {
        name: "pagecache",
        about: "page cache insertions and removals",
        events: &[
            "filemap/file_check_and_advance_wb_err",
            "filemap/filemap_set_wb_err",
            "filemap/mm_filemap_add_to_page_cache",
            "filemap/mm_filemap_delete_from_page_cache",
        ],
    },
    Category {
        name: "preemptoff",
        about: "preemption disabled (preemptirq)",
        events: &["preemptirq/preempt_disable", "preemptirq/preempt_enable"],
    },
    Category {
        name: "regulators",
        about: "voltage regulators",
        events: &[
            "regulator/regulator_disable",
            "regulator/regulator_disable_complete",
            "regulator/regulator_enable",
            "regulator/regulator_enable_complete",
            "regulator/regulator_enable_delay",
            "regulator/regulator_set_voltage",
            "regulator/regulator_set_voltage_complete",
        ],
    },
    Category {
        name: "sched",
        about: "scheduling: switches, wakeups, blocked reasons, exits, cgroups, task renames",
        events: &[
            "cgroup/cgroup_attach_task",
            "cgroup/cgroup_destroy_root",
            "cgroup/cgroup_mkdir",
            "cgroup/cgroup_release",
            "cgroup/cgroup_remount",
            "cgroup/cgroup_rename",
            "cgroup/cgroup_rmdir",
            "cgroup/cgroup_setup_root",
            "cgroup/cgroup_transfer_tasks",
            "oom/oom_score_adj_update",
            "sched/sched_blocked_reason",
            "sched/sched_cpu_hotplug",
            "sched/sched_pi_setprio",
            "sched/sched_process_exit",
            "sched/sched_switch",
            "sched/sched_waking",
            "scm/scm_call_end",
            "scm/scm_call_start",
            "systrace/0",
            "task/task_newtask",
            "task/task_rename",
        ],
    },
    Category {
        name: "sync",
        about: "sync points and DMA fences",
        events: &[
            "dma_fence/dma_fence_emit",
            "dma_fence/dma_fence_init",
            "dma_fence/dma_fence_signaled",
            "dma_fence/dma_fence_wait_end",
            "dma_fence/dma_fence_wait_start",
            "fence/fence_annotate_wait_on",
            "fence/fence_destroy",
            "fence/fence_emit",
            "fence/fence_enable_signal",
            "fence/fence_init",
            "fence/fence_signaled",
            "fence/fence_wait_end",
            "fence/fence_wait_start",
            "sync/sync_pt",
            "sync/sync_timeline",
            "sync/sync_wait",
        ],
    },
    Category {
        name: "thermal",
        about: "temperatures and cooling devices",
        events: &["thermal/cdev_update", "thermal/thermal_temperature"],
    },
    Category {
        name: "workq",
        about: "workqueue work items",
        events: &[
            "workqueue/workqueue_activate_work",
            "workqueue/workqueue_execute_end",
            "workqueue/workqueue_execute_start",
            "workqueue/workqueue_queue_work",
        ],
    },
];

/// The category named `name`, if it is one.
pub(crate) fn find(name: &str) -> Option<&'static Category> {
    CATEGORIES.iter().find(|c| c.name == name)
}

/// The kernel events `categories` add, in table order, each once: what an
/// `atrace_categories` list asks of ftrace on Linux (before `ftrace/print`,
/// which any category adds).
pub fn events_of<'a>(categories: impl IntoIterator<Item = &'a str>) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for c in categories.into_iter().filter_map(find) {
        for e in c.events {
            if !out.contains(e) {
                out.push(e);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::event_name::event_spec_problem;

    #[test]
    fn the_table_is_sorted_and_every_event_is_a_plain_group_and_name() {
        let names: Vec<&str> = CATEGORIES.iter().map(|c| c.name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted);
        for c in CATEGORIES {
            for e in c.events {
                assert_eq!(event_spec_problem(e), None, "{}: {e}", c.name);
                assert!(e.contains('/') && !e.ends_with("/*"), "{e}");
            }
        }
    }

    #[test]
    fn sched_freq_and_idle_add_what_perfetto_adds() {
        let e = events_of(["sched", "freq", "idle"]);
        for want in [
            "sched/sched_switch",
            "sched/sched_waking",
            "sched/sched_blocked_reason",
            "sched/sched_process_exit",
            "task/task_newtask",
            "oom/oom_score_adj_update",
            "power/cpu_frequency",
            "power/suspend_resume",
            "cpuhp/cpuhp_enter",
            "power/cpu_idle",
        ] {
            assert!(e.contains(&want), "{want}: {e:?}");
        }
        // Perfetto leaves sched_wakeup out on purpose (sched_waking covers it).
        assert!(!e.contains(&"sched/sched_wakeup"));
        // Each once, however often named.
        assert_eq!(events_of(["idle", "idle"]), ["power/cpu_idle"]);
        assert!(events_of(["am", "view"]).is_empty());
    }
}
