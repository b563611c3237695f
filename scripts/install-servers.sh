#!/usr/bin/env bash
# Installs the servers the tests start (Debian's redis-server, zookeeper and
# postgresql (the fence tests; started as the package's `postgres` user); ZooKeeper runs on the machine's Java 17) and the interop peers (redis-py and
# kazoo from PyPI, Apache Curator from Debian). Idempotent; apt-get needs root.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
[ -f /usr/share/java/slf4j-simple.jar ] || missing+=(libslf4j-java)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
# PostgreSQL: initdb and postgres under /usr/lib/postgresql/<major>/bin.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# Interop peer: Apache Curator 5.4, compiled against with javac.
[ -f /usr/share/java/curator-recipes.jar ] || missing+=(libcurator-recipes-java libcurator-framework-java)
command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless)

# Peers for interop tests: redis-py and kazoo.
for module in redis kazoo; do
    if ! python3 -c "import $module" >/dev/null 2>&1; then
        echo "install-servers: installing the python package $module (interop peer)"
        python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "$module"
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-servers: redis-server, zookeeper, postgresql and java are present"
    exit 0
fi

echo "install-servers: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The redis-server package may start a system service on 6379; the tests
# start their own servers on free ports and do not use it.
command -v redis-server >/dev/null
[ -f /usr/share/java/zookeeper.jar ]
# The postgresql package creates a cluster and a service on 5432; the tests
# start their own servers (initdb in a temp dir, a free port) and do not use it.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
id postgres >/dev/null
echo "install-servers: done"
