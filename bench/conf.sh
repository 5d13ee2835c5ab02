# bench/conf.sh, sourced by the bench shell scripts: bench_conf DIR SIZE
# writes DIR/dstage.conf, a configuration of its own under DIR (cache of
# SIZE, e.g. 4G, catalog, the stager daemon's socket; warnings logged);
# bench_stage BUILD DIR stages DIR/src as dataset d under that
# configuration (DSTAGE_CONFIG set) with BUILD's stager daemon, started
# and stopped for it (its log: DIR/daemon.log).
bench_conf() {
	cat >"$1/dstage.conf" <<CONF
[cache]
dir = $1/cache
size = $2
[catalog]
path = $1/catalog.db
[daemon]
socket = $1/stager.sock
[log]
level = warn
CONF
}

bench_stage() {
	local daemon
	"$1/stager/stager" daemon >"$2/daemon.log" 2>&1 &
	daemon=$!
	for _ in $(seq 50); do [ -S "$2/stager.sock" ] && break; sleep 0.1; done
	"$1/stager/stager" add d "file://$2/src/" >/dev/null
	"$1/stager/stager" stage d --wait >/dev/null
	kill "$daemon"
	wait "$daemon" 2>/dev/null || true
}
