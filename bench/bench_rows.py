"""bench_rows: each measured row's text, unit, limit and target, from the
limits of the run (moved out of bench/run, behaviour unchanged)."""
import ceiling
import fair_bench
import million_bench


def define_rows(b, warm_rounds):
    """Each measured row's text, unit, limit and target (rows a partial
    run, --rows, did not measure are left out)."""
    L = b.limits

    def row(rid, *a, limit_cpu=None):
        if rid in b.rows:
            b.row(rid, *a)
            if limit_cpu is not None:
                b.rows[rid]["limit_cpu_s_per_GiB"] = limit_cpu

    def lmin(*keys):
        vals = [L[k] for k in keys if L.get(k)]
        return min(vals) if vals else None
    stage_lim = lmin("curl_8_ranged_get_MBps", "disk_direct_write_MBps",
                     "sha256_all_cores_MBps")
    verify_lim = min(L.get("disk_direct_read_verify_MBps", L.get("disk_direct_read_MBps")) or 1e12,
                     L.get("sha256_all_cores_MBps") or 1e12)
    verify_lim = None if verify_lim >= 1e12 else verify_lim
    row("large_cold", "large files, sequential read, cold", "MB/s",
        L.get("curl_8_ranged_get_MBps"), "curl, 8 parallel ranged GETs (store elsewhere)",
        0.9, limit_cpu=L.get("curl_8_ranged_get_cpu_s_per_GiB"))
    row("large_cold_shared", "large files, cold, store and client sharing all cores",
        "MB/s", L.get("curl_8_ranged_get_shared_MBps"),
        "curl, 8 parallel ranged GETs, all cores shared", 0.9,
        limit_cpu=L.get("curl_8_ranged_get_shared_cpu_s_per_GiB"))
    row("file_cold", "large file, cold, file:// source on tmpfs", "MB/s",
        L.get("cache_disk_direct_write_MBps"),
        f"dd oflag=direct into the cache disk (medians of {warm_rounds}, alternated)", 0.9)
    row("large_warm", "large files, sequential read, warm (page cache dropped)",
        "MB/s", L.get("cache_files_dd_read_MBps"),
        "dd bs=4M of the cache files, page cache dropped "
        f"(medians of {warm_rounds}, alternated)", 0.9)
    row("large_warm_scraped", "large files, warm, /metrics scraped every 1 s",
        "MB/s", L.get("warm_no_scraper_MBps"),
        "the same read without a scraper "
        f"(medians of {warm_rounds}, alternated)", 0.95)
    row("large_epoch2", "large files, second epoch (page cache kept)", "MB/s",
        L.get("page_cache_epoch_MBps", L.get("page_cache_read_MBps")),
        "page-cache read of local copies of the same files "
        f"(medians of {warm_rounds}, right after)", 0.8)
    row("overlay_warm", "transparent mode (dstagefs --over), warm read, page "
        "cache dropped", "MB/s", L.get("overlay_cachefile_MBps"),
        "the cache's object files read directly after the same drop", 0.9)
    row("overlay_cold", "transparent mode, cold read (first read fills the "
        "cache)", "MB/s", L.get("overlay_tree_cold_MBps"),
        "the tree read directly, page cache dropped (here: local disk)")
    row("overlay_vs_tree", "transparent mode, warm read against the tree "
        "itself", "MB/s", L.get("overlay_tree_cold_MBps"),
        "the tree read directly, page cache dropped (on a cluster: the "
        "parallel FS)")
    for n in (1, 8):
        row(f"small_cold_{n}", f"small files, cold, {n} reader(s)", "files/s",
            L.get(f"curl_small_get_{n}_fps"), f"curl GETs, {n} kept-alive stream(s)")
        if f"local_small_same_{n}_fps" in L:
            row(f"small_warm_{n}", f"small files, warm, {n} reader(s)", "files/s",
                L[f"local_small_same_{n}_fps"],
                f"local disk, the same files, page cache dropped, {n} reader(s) "
                f"(medians of {warm_rounds}, alternated)", 0.8)
        else:  # results written before the alternated limit
            row(f"small_warm_{n}", f"small files, warm, {n} reader(s)", "files/s",
                L.get(f"local_small_cold_{n}_fps"),
                f"local disk, same files, page cache dropped, {n} reader(s)")
        k = max(n, fair_bench.PREFETCH_STREAMS)
        if getattr(b, "prefetch_source", "s3") == "file":
            row(f"prefetch_{n}", f"small files, cold, shuffled, .dstage/prefetch list, "
                f"{n} reader(s), file:// source", "files/s", L.get(f"local_prefetch_{k}_fps"),
                f"local disk, same files and order, cold, {k} reader(s)", 0.9)
        else:
            row(f"prefetch_{n}", f"small files, cold, shuffled, .dstage/prefetch list, "
                f"{n} reader(s)", "files/s", L.get(f"curl_small_get_{k}_fps"),
                f"curl GETs, {k} kept-alive stream(s) (what the read keeps in flight)", 0.9)
    row("stat_all", "stat every file of the metadata tree", "files/s",
        L.get("local_stat_fps"), "same tree on local disk, caches dropped", 0.5)
    row("stage", "stager stage (large files)", "MB/s", stage_lim,
        "min(curl GET, disk write, SHA-256 all cores) (store elsewhere)", 0.9,
        limit_cpu=L.get("curl_8_ranged_get_cpu_s_per_GiB"))
    row("stage_shared", "stager stage (large files), all cores shared", "MB/s",
        lmin("curl_8_ranged_get_shared_MBps", "disk_direct_write_MBps",
             "sha256_all_cores_MBps"),
        "min(curl GET all cores shared, disk write, SHA-256 all cores)", 0.9,
        limit_cpu=L.get("curl_8_ranged_get_shared_cpu_s_per_GiB"))
    row("file_stage", "stager stage, file:// source on tmpfs", "MB/s",
        lmin("cache_disk_direct_write_MBps", "sha256_all_cores_MBps"),
        f"min(dd oflag=direct into the cache disk, SHA-256 all cores) "
        f"(medians of {warm_rounds}, alternated)", 0.9)
    for r in getattr(b, "ckpt_rows", []) + getattr(b, "mlperf_rows", []):
        row(r["id"], r["what"], r["unit"], r["limit"], r["limit_what"], r["target"])
        if r.get("scale") and r["id"] in b.rows:
            b.rows[r["id"]]["scale"] = r["scale"]
    row("verify_cache", "stager verify --cache (large files)", "MB/s", verify_lim,
        f"min(fio read, SHA-256 all cores) (medians of {warm_rounds}, alternated)", 0.9)
    for r in million_bench.row_defs(L):
        row(*r)
    for r in ceiling.row_defs(L, warm_rounds):
        row(*r)
