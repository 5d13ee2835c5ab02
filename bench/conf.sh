# bench/conf.sh, sourced by the bench shell scripts: bench_conf DIR SIZE
# writes DIR/dstage.conf, a configuration of its own under DIR (cache of
# SIZE, e.g. 4G, catalog, the stager daemon's socket; warnings logged).
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
