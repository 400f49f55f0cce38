#!/bin/sh
# The Secrets deploy/kubernetes/rmqha.yaml reads, made with `rmqha certs` and kubectl:
#
#   rmqha-tls      ca.crt, and a certificate and key per pod named after the pod
#                  (rmqha-controller-0.crt, rmqha-broker-a-2.key, rmqha-namesrv.crt, ...)
#   rmqha-acl      plain_acl.yml (brokers' ACL 1.0 accounts; see deploy/plain_acl.example.yml)
#   rmqha-secrets  cluster-secret (made once, kept afterwards)
#
#   deploy/kubernetes/make-secrets.sh PKI_DIR PLAIN_ACL_YML [NAMESPACE]
#
# PKI_DIR holds the cluster CA: its key (ca.key) never goes into a Secret; keep it off the
# cluster. Running the script again renews every certificate with the same CA and updates
# the Secrets; pods read the renewed files for their next connections, without a restart.
# admin-admin.crt/.key in PKI_DIR are for operators' `rmqha` commands.
set -eu
pki=${1:?usage: make-secrets.sh PKI_DIR PLAIN_ACL_YML [NAMESPACE]}
acl=${2:?usage: make-secrets.sh PKI_DIR PLAIN_ACL_YML [NAMESPACE]}
ns=${3:-default}

[ -f "$pki/ca.key" ] || rmqha certs init --dir "$pki"
files="--from-file=ca.crt=$pki/ca.crt"
add() {  # add POD STEM: the pair STEM.crt/.key of PKI_DIR as POD.crt/.key
  files="$files --from-file=$1.crt=$pki/$2.crt --from-file=$1.key=$pki/$2.key"
}
for i in 0 1 2; do
  rmqha certs issue --dir "$pki" --role controller --name "n$i" --dns "rmqha-controller-$i.rmqha-controller"
  add "rmqha-controller-$i" "controller-n$i"
  rmqha certs issue --dir "$pki" --role broker --cluster rmqha --group broker-a --name "rmqha-broker-a-$i"
  add "rmqha-broker-a-$i" "broker-rmqha-broker-a-rmqha-broker-a-$i"
done
rmqha certs issue --dir "$pki" --role namesrv --name ns0 --dns rmqha-namesrv
add rmqha-namesrv namesrv-ns0
rmqha certs issue --dir "$pki" --role admin --name admin

# shellcheck disable=SC2086 # $files is a list of flags
kubectl -n "$ns" create secret generic rmqha-tls $files --dry-run=client -o yaml | kubectl -n "$ns" apply -f -
kubectl -n "$ns" create secret generic rmqha-acl --from-file=plain_acl.yml="$acl" \
  --dry-run=client -o yaml | kubectl -n "$ns" apply -f -
if ! kubectl -n "$ns" get secret rmqha-secrets >/dev/null 2>&1; then
  kubectl -n "$ns" create secret generic rmqha-secrets \
    --from-literal=cluster-secret="$(openssl rand -hex 32)"
fi
