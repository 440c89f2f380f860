"""deploy/gie/rbac.yaml: the picker's service account may read (get, list, watch) what Kubernetes
discovery lists and watches, its InferencePool and that pool's pods, in its own namespace, and
nothing else; the picker's Deployment runs as that account."""

from tests.deploy.test_gie_manifests import GIE, by_kind

READ = ["get", "list", "watch"]


def test_the_epp_runs_as_an_account_that_may_watch_the_pool_and_its_pods_and_nothing_else() -> None:
    rbac = by_kind(GIE / "rbac.yaml")
    (account,), (role,), (binding,) = rbac["ServiceAccount"], rbac["Role"], rbac["RoleBinding"]
    grants = {(group, resource): rule["verbs"] for rule in role["rules"] for group in rule["apiGroups"]
              for resource in rule["resources"]}  # fmt: skip
    assert grants == {("", "pods"): READ, ("inference.networking.k8s.io", "inferencepools"): READ}
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"]}]
    (deployment,) = by_kind(GIE / "epp.yaml")["Deployment"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert all("namespace" not in document["metadata"] for document in (account, role, binding)), (
        "namespaced with the rest of the kustomization"
    )
