package deploy

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/meridian-router/meridian/control/kube/kubetest"
	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/mtls"
)

// rendered is one helm template of the chart, by kind and name.
type rendered struct {
	objs []*unstructured.Unstructured
}

func render(t *testing.T, h string, values string, set ...string) rendered {
	t.Helper()
	args := []string{"template", "r1", chart, "-n", "meridian", "--kube-version", "1.37.2"}
	if values != "" {
		args = append(args, "-f", valuesFile(t, values))
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return rendered{objs: docs(t, run(t, h, args...))}
}

func (r rendered) get(t *testing.T, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range r.objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("the chart renders no %s %s", kind, name)
	return nil
}

func (r rendered) has(kind, name string) bool {
	for _, o := range r.objs {
		if o.GetKind() == kind && o.GetName() == name {
			return true
		}
	}
	return false
}

func (r rendered) deployment(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(r.get(t, "Deployment", name).Object, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

func container(t *testing.T, d *appsv1.Deployment, name string) corev1.Container {
	t.Helper()
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("Deployment %s has no container %s", d.Name, name)
	return corev1.Container{}
}

// flag is the value of --name=value in args, and whether it is there.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// mountedSecret is the Secret volume mounted at dir in c, and the secret's key a file
// path under dir names.
func mountedSecret(t *testing.T, d *appsv1.Deployment, c corev1.Container, file string) (secret, key string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if path.Dir(file) != m.MountPath {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
					t.Errorf("%s/%s: the Secret %s is readable by others (defaultMode %v)", d.Name, c.Name, v.Secret.SecretName, v.Secret.DefaultMode)
				}
				return v.Secret.SecretName, path.Base(file)
			}
		}
	}
	t.Fatalf("%s/%s: %s is not in a mounted Secret (mounts %+v)", d.Name, c.Name, file, c.VolumeMounts)
	return "", ""
}

// tlsFiles checks that c runs with --tls-cert, --tls-key and --tls-ca from one mounted
// Secret and not --insecure, and returns that Secret's name.
func tlsFiles(t *testing.T, d *appsv1.Deployment, c corev1.Container) string {
	t.Helper()
	if slices.Contains(c.Args, "--insecure") {
		t.Errorf("%s/%s runs --insecure by default: %v", d.Name, c.Name, c.Args)
	}
	var secret string
	for flag, key := range map[string]string{"tls-cert": "tls.crt", "tls-key": "tls.key", "tls-ca": "ca.crt"} {
		v, ok := flagValue(c.Args, flag)
		if !ok {
			t.Fatalf("%s/%s has no --%s: %v", d.Name, c.Name, flag, c.Args)
		}
		s, k := mountedSecret(t, d, c, v)
		if k != key {
			t.Errorf("%s/%s: --%s=%s reads the Secret's key %q, want %q (a kubernetes.io/tls Secret)", d.Name, c.Name, flag, v, k, key)
		}
		if secret != "" && s != secret {
			t.Errorf("%s/%s: TLS files from two Secrets, %s and %s", d.Name, c.Name, s, secret)
		}
		secret = s
	}
	return secret
}

// envoyTLS checks the gateway's Envoy: the bootstrap in its ConfigMap reads its
// certificate through SDS files that the ConfigMap holds, and those name files of the
// Secret mounted into the Envoy container. It returns that Secret's name.
func envoyTLS(t *testing.T, r rendered, d *appsv1.Deployment, node string) string {
	t.Helper()
	envoy := container(t, d, "envoy")
	cm := r.get(t, "ConfigMap", "r1-meridian-envoy")
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	boot := data["envoy.yaml"]
	for _, want := range []string{"spiffe://meridian/control", "spiffe://meridian/node/" + node + "/sidecar", "id: " + node} {
		if !strings.Contains(boot, want) {
			t.Errorf("the gateway's bootstrap does not name %q", want)
		}
	}
	var secret string
	for _, kind := range []string{"cert", "ca"} {
		p := envoySDSDir + "/envoy-" + node + "-" + kind + ".sds.yaml"
		if !strings.Contains(boot, "path: "+p) {
			t.Errorf("the bootstrap does not read %s", p)
		}
		sds, ok := data[path.Base(p)]
		if !ok {
			t.Fatalf("the bootstrap reads %s; the ConfigMap has no key %s (keys: %v)", p, path.Base(p), keys(data))
		}
		var res struct {
			Resources []struct {
				TLSCertificate *struct {
					CertificateChain struct{ Filename string } `json:"certificate_chain"`
					PrivateKey       struct{ Filename string } `json:"private_key"`
				} `json:"tls_certificate"`
				ValidationContext *struct {
					TrustedCA struct{ Filename string } `json:"trusted_ca"`
				} `json:"validation_context"`
			}
		}
		if err := yaml.Unmarshal([]byte(sds), &res); err != nil || len(res.Resources) != 1 {
			t.Fatalf("%s: %v %+v", p, err, res)
		}
		var files map[string]string
		if c := res.Resources[0].TLSCertificate; c != nil {
			files = map[string]string{"tls.crt": c.CertificateChain.Filename, "tls.key": c.PrivateKey.Filename}
		} else {
			files = map[string]string{"ca.crt": res.Resources[0].ValidationContext.TrustedCA.Filename}
		}
		for key, f := range files {
			s, k := mountedSecret(t, d, envoy, f)
			if k != key {
				t.Errorf("%s names %s, the Secret's key %q; want %q", p, f, k, key)
			}
			secret = s
		}
	}
	for _, m := range envoy.VolumeMounts {
		if m.MountPath == envoySDSDir && m.Name != "bootstrap" {
			t.Errorf("Envoy's %s is the volume %s, not the bootstrap ConfigMap", envoySDSDir, m.Name)
		}
	}
	return secret
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestChartTLS: by default every meridian connection is mutual TLS, with the certificates
// from the Secrets the values name; cert-manager Certificates issue those Secrets with the
// identities mtls expects; plaintext needs tls.insecure=true and the NetworkPolicy, and
// contradictions are refused.
func TestChartTLS(t *testing.T) {
	h := helm(t)
	r := render(t, h, "")
	control := r.deployment(t, "r1-meridian-control")
	if s := tlsFiles(t, control, container(t, control, "control")); s != "r1-meridian-control-tls" {
		t.Errorf("the control server's Secret is %q, want the default r1-meridian-control-tls", s)
	}
	gw := r.deployment(t, "r1-meridian-gateway")
	sidecar := container(t, gw, "sidecar")
	if s := tlsFiles(t, gw, sidecar); s != "r1-meridian-sidecar-tls" {
		t.Errorf("the sidecar's Secret is %q", s)
	}
	if node, _ := flagValue(sidecar.Args, "node-id"); node != "gateway" {
		t.Errorf("sidecar --node-id=%q", node)
	}
	if s := envoyTLS(t, r, gw, "gateway"); s != "r1-meridian-envoy-tls" {
		t.Errorf("Envoy's Secret is %q", s)
	}
	if r.has("Certificate", "r1-meridian-control-tls") {
		t.Error("Certificates rendered without tls.certManager.enabled")
	}

	// Secrets named by the values, and cert-manager issuing them.
	r = render(t, h, `
tls:
  secrets: {control: c-tls, sidecar: s-tls, envoy: e-tls}
  certManager:
    enabled: true
    issuerRef: {name: meridian-ca, kind: ClusterIssuer}
gateway:
  nodeId: us-east
fleet:
  clusters:
    - {name: us-east, region: us-east}
  rtt_ms:
    us-east: {us-east: 1}
`)
	control = r.deployment(t, "r1-meridian-control")
	gw = r.deployment(t, "r1-meridian-gateway")
	got := map[string]string{
		tlsFiles(t, control, container(t, control, "control")): mtls.Control().URI(),
		tlsFiles(t, gw, container(t, gw, "sidecar")):           mtls.Sidecar("us-east").URI(),
		envoyTLS(t, r, gw, "us-east"):                          mtls.Envoy("us-east").URI(),
	}
	for secret, id := range got {
		c := r.get(t, "Certificate", secret)
		sn, _, _ := unstructured.NestedString(c.Object, "spec", "secretName")
		uris, _, _ := unstructured.NestedStringSlice(c.Object, "spec", "uris")
		usages, _, _ := unstructured.NestedStringSlice(c.Object, "spec", "usages")
		issuer, _, _ := unstructured.NestedString(c.Object, "spec", "issuerRef", "name")
		kind, _, _ := unstructured.NestedString(c.Object, "spec", "issuerRef", "kind")
		if sn != secret || !slices.Equal(uris, []string{id}) || !slices.Contains(usages, "server auth") || !slices.Contains(usages, "client auth") ||
			issuer != "meridian-ca" || kind != "ClusterIssuer" {
			t.Errorf("Certificate %s: secretName %q uris %v usages %v issuer %s %s; want %s, [%s], server and client auth, ClusterIssuer meridian-ca",
				secret, sn, uris, usages, kind, issuer, secret, id)
		}
	}
	run(t, h, "lint", "--strict", chart, "--set", "tls.certManager.enabled=true", "--set", "tls.certManager.issuerRef.name=ca")

	// tls.insecure=true: plaintext, said so in the args; no Secret is mounted.
	r = render(t, h, "", "tls.insecure=true")
	control = r.deployment(t, "r1-meridian-control")
	gw = r.deployment(t, "r1-meridian-gateway")
	for _, c := range []corev1.Container{container(t, control, "control"), container(t, gw, "sidecar")} {
		if !slices.Contains(c.Args, "--insecure") {
			t.Errorf("with tls.insecure=true, %s lacks --insecure: %v", c.Name, c.Args)
		}
		if _, ok := flagValue(c.Args, "tls-cert"); ok {
			t.Errorf("with tls.insecure=true, %s still has --tls-cert", c.Name)
		}
	}
	for _, d := range []*appsv1.Deployment{control, gw} {
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Secret != nil {
				t.Errorf("with tls.insecure=true, %s mounts the Secret %s", d.Name, v.Secret.SecretName)
			}
		}
	}
	boot, _, _ := unstructured.NestedString(r.get(t, "ConfigMap", "r1-meridian-envoy").Object, "data", "envoy.yaml")
	if strings.Contains(boot, "transport_socket") {
		t.Error("with tls.insecure=true the bootstrap still has TLS transport sockets")
	}
	run(t, h, "lint", "--strict", chart, "--set", "tls.insecure=true")

	// Refused: each names what to change.
	for _, c := range []struct {
		set  []string
		want string
	}{
		{[]string{"tls.insecure=true", "networkPolicy.enabled=false"}, "tls.insecure=true needs networkPolicy.enabled=true"},
		{[]string{"tls.insecure=true", "tls.certManager.enabled=true", "tls.certManager.issuerRef.name=ca"}, "contradict"},
		{[]string{"tls.certManager.enabled=true"}, "needs tls.certManager.issuerRef.name"},
		{[]string{"gateway.nodeId=a/b"}, `gateway.nodeId "a/b"`},
	} {
		args := []string{"template", "r1", chart, "--kube-version", "1.37.2"}
		for _, s := range c.set {
			args = append(args, "--set", s)
		}
		var stderr bytes.Buffer
		cmd := exec.Command(h, args...)
		cmd.Stderr = &stderr
		if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("helm template --set %v: err %v, stderr %q; want a failure saying %q", c.set, err, stderr.String(), c.want)
		}
	}
}

// certSecrets runs meridian-certs --kubernetes-secrets, the chart's documented way to
// make its Secrets, and returns the manifests.
func certSecrets(t *testing.T, prefix, node string) []*unstructured.Unstructured {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "meridian-certs")
	build := exec.Command("go", "build", "-o", bin, "github.com/meridian-router/meridian/mtls/cmd/meridian-certs")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build meridian-certs: %v\n%s", err, out)
	}
	pki := filepath.Join(dir, "pki")
	run(t, bin, "--dir", pki, "--nodes", node, "--kubernetes-secrets", prefix)
	data, err := os.ReadFile(filepath.Join(pki, prefix+"-secrets.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(pki, prefix+"-secrets.yaml")); fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("the Secrets file (private keys) is mode %v", fi.Mode().Perm())
	}
	return docs(t, string(data))
}

// secretProves writes a Secret's data where its files would be mounted and loads them as
// the process would: the certificate must name id and chain to the Secret's ca.crt.
func secretProves(t *testing.T, s *corev1.Secret, id mtls.Identity) {
	t.Helper()
	dir := t.TempDir()
	for _, k := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if err := os.WriteFile(filepath.Join(dir, k), s.Data[k], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	files := mtls.Files{Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key"), CA: filepath.Join(dir, "ca.crt")}
	if _, err := mtls.NewSource(files, id, slog.New(slog.DiscardHandler)); err != nil {
		t.Errorf("the Secret %s does not serve %s: %v", s.Name, id, err)
	}
}

// chartSecretsProve checks, on the API server, that each Secret the applied chart mounts
// exists and proves the identity of the process that mounts it.
func chartSecretsProve(t *testing.T, ctx context.Context, env *kubetest.Env, ns string, r rendered) {
	t.Helper()
	control := r.deployment(t, "r1-meridian-control")
	gw := r.deployment(t, "r1-meridian-gateway")
	node, _ := flagValue(container(t, gw, "sidecar").Args, "node-id")
	for secret, id := range map[string]mtls.Identity{
		tlsFiles(t, control, container(t, control, "control")): mtls.Control(),
		tlsFiles(t, gw, container(t, gw, "sidecar")):           mtls.Sidecar(node),
		envoyTLS(t, r, gw, node):                               mtls.Envoy(node),
	} {
		s, err := env.Client.CoreV1().Secrets(ns).Get(ctx, secret, metav1.GetOptions{})
		if err != nil {
			t.Errorf("the chart mounts the Secret %s: %v", secret, err)
			continue
		}
		if s.Type != corev1.SecretTypeTLS {
			t.Errorf("Secret %s is of type %s, want %s", secret, s.Type, corev1.SecretTypeTLS)
		}
		secretProves(t, s, id)
	}
}

// TestK8sChartInsecureIsLoud: an install with tls.insecure=true, against a real API
// server, prints the INSECURE warning.
func TestK8sChartInsecureIsLoud(t *testing.T) {
	h := helm(t)
	env := kubetest.Start(t)
	kc := kubetest.Kubeconfig(t, env.Config)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "meridian"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The kube-apiserver scripts/k8s-tools.sh builds reports v0.0.0-master (no version
	// stamped at build), which the chart's kubeVersion refuses: install a copy without it.
	dir := filepath.Join(t.TempDir(), chart)
	if err := os.CopyFS(dir, os.DirFS(chart)); err != nil {
		t.Fatal(err)
	}
	meta, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.Split(string(meta), "\n") {
		if !strings.HasPrefix(l, "kubeVersion:") {
			kept = append(kept, l)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "Chart.yaml"), []byte(strings.Join(kept, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		set  string
		want string
		not  string
	}{
		{"tls.insecure=true", "INSECURE: tls.insecure=true", "mutual TLS"},
		{"tls.insecure=false", "meridian-certs --dir ./pki --nodes gateway --kubernetes-secrets r1-meridian", "INSECURE"},
	} {
		out := run(t, h, "install", "r1", dir, "-n", "meridian", "--kubeconfig", kc, "--dry-run=server", "--set", c.set)
		i := strings.Index(out, "NOTES:")
		if i < 0 {
			t.Fatalf("helm install --set %s printed no NOTES:\n%s", c.set, out)
		}
		notes := out[i:]
		if !strings.Contains(notes, c.want) || strings.Contains(notes, c.not) {
			t.Errorf("helm install --set %s: NOTES lack %q or have %q:\n%s", c.set, c.want, c.not, notes)
		}
	}
}

// TestChartEnvoyBootstrapValidates: the gateway's bootstrap ConfigMap, laid out as the pod
// mounts it (the paths moved under a temporary directory) with the envoy Secret's files,
// is accepted by the real Envoy (--mode validate), which also checks that the SDS files
// the bootstrap names are there. With tls.insecure=true too.
func TestChartEnvoyBootstrapValidates(t *testing.T) {
	h := helm(t)
	envoy := stack.RequireEnvoy(t)
	ca, err := mtls.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, set := range []string{"tls.insecure=false", "tls.insecure=true"} {
		r := render(t, h, "", set)
		root := t.TempDir()
		move := strings.NewReplacer("/etc/envoy-tls", root+"/envoy-tls", "/etc/envoy", root+"/envoy")
		data, _, _ := unstructured.NestedStringMap(r.get(t, "ConfigMap", "r1-meridian-envoy").Object, "data")
		for _, dir := range []string{"envoy", "envoy-tls"} {
			if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for k, v := range data {
			if err := os.WriteFile(filepath.Join(root, "envoy", k), []byte(move.Replace(v)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		crt, key, err := ca.Issue(mtls.Envoy("gateway"), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		for name, b := range map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": ca.PEM} {
			if err := os.WriteFile(filepath.Join(root, "envoy-tls", name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command(envoy, "--mode", "validate", "-c", filepath.Join(root, "envoy", "envoy.yaml"), "--log-level", "warn")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("--set %s: Envoy refuses the chart's bootstrap: %v\n%s", set, err, out)
		}
	}
}

// runChartPods runs the applied chart's control and sidecar containers as processes: their
// args as rendered, with the mounts moved under a temporary directory (filled from the
// API server's Secrets and ConfigMaps, as a kubelet would) and the pod addresses on
// loopback. The sidecar gets its snapshot from the control server over mutual TLS with the
// Secrets meridian-certs made: the chart's TLS default works end to end.
func runChartPods(t *testing.T, ctx context.Context, env *kubetest.Env, ns string, r rendered) {
	t.Helper()
	dir := t.TempDir()
	bins, err := stack.Build(filepath.Join(dir, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	ports := map[string]int{}
	for _, name := range []string{"xds", "http", "ext_proc", "sidecar-http", "peer"} {
		if ports[name], err = stack.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	loop := func(name string) string { return "127.0.0.1:" + strconv.Itoa(ports[name]) }
	// What the kubelet would mount.
	mount := func(path string, data map[string][]byte) string {
		p := filepath.Join(dir, path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		for k, v := range data {
			if err := os.WriteFile(filepath.Join(p, k), v, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	secret := func(name string) map[string][]byte {
		s, err := env.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s.Data
	}
	cm, err := env.Client.CoreV1().ConfigMaps(ns).Get(ctx, "r1-meridian-fleet", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := kubetest.Kubeconfig(t, env.Config)
	// The pod's service account is the in-cluster config; here a kubeconfig (RBAC is
	// checked as the service account in TestK8sChartApplies).
	var fleetDoc map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["fleet.yaml"]), &fleetDoc); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(fleetDoc, kubeconfig, "discovery", "kubernetes", "kubeconfig"); err != nil {
		t.Fatal(err)
	}
	fleetYAML, err := yaml.Marshal(fleetDoc)
	if err != nil {
		t.Fatal(err)
	}
	control := r.deployment(t, "r1-meridian-control")
	gw := r.deployment(t, "r1-meridian-gateway")
	xdsHost := fmt.Sprintf("r1-meridian-control.%s.svc.cluster.local:%d", ns, 18000)
	move := strings.NewReplacer(
		"/etc/meridian-tls", mount("control-tls", secret(tlsFiles(t, control, container(t, control, "control")))),
		"/etc/meridian/", mount("meridian", map[string][]byte{"fleet.yaml": fleetYAML})+"/",
		"0.0.0.0:18000", loop("xds"), "0.0.0.0:18080", loop("http"))
	sidecarMove := strings.NewReplacer(
		"/etc/meridian-tls", mount("sidecar-tls", secret(tlsFiles(t, gw, container(t, gw, "sidecar")))),
		xdsHost, loop("xds"), "127.0.0.1:19001", loop("ext_proc"), "0.0.0.0:19081", loop("sidecar-http"),
		// The pod's address, and the headless Service that names every gateway pod: here the
		// one sidecar, which watches itself and must recognize it.
		"[$(POD_IP)]:19082", loop("peer"), fmt.Sprintf("r1-meridian-gateway-peers.%s.svc.cluster.local:19082", ns), loop("peer"))
	args := func(c corev1.Container, m *strings.Replacer) []string {
		var out []string
		for _, a := range c.Args {
			a = m.Replace(a)
			if strings.Contains(a, "/etc/") || strings.Contains(a, "0.0.0.0") || strings.Contains(a, ".svc.cluster.local") || strings.Contains(a, "$(") {
				t.Fatalf("%s: the arg %q names a pod path or address this test does not provide", c.Name, a)
			}
			out = append(out, a)
		}
		return out
	}
	cp := &stack.Proc{Name: "control", Bin: bins.Control, Log: filepath.Join(dir, "control.log"),
		Args: append(args(container(t, control, "control"), move), "--kubeconfig", kubeconfig),
		Env:  []string{"POD_IP=127.0.0.1", "POD_NAMESPACE=" + ns}}
	sp := &stack.Proc{Name: "sidecar", Bin: bins.Sidecar, Log: filepath.Join(dir, "sidecar.log"), Args: args(container(t, gw, "sidecar"), sidecarMove)}
	for _, p := range []*stack.Proc{cp, sp} {
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Stop(5 * time.Second) })
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := stack.WaitHTTP(wctx, "http://"+loop("sidecar-http")+"/healthz", 200); err != nil {
		c, _ := os.ReadFile(cp.Log)
		s, _ := os.ReadFile(sp.Log)
		t.Fatalf("the chart's sidecar got no snapshot from the chart's control server: %v\ncontrol log:\n%s\nsidecar log:\n%s", err, c, s)
	}
	logs, _ := os.ReadFile(cp.Log)
	if strings.Contains(string(logs), "INSECURE") {
		t.Errorf("the chart's control server runs insecure:\n%s", logs)
	}
	// Its peer exchange runs over mutual TLS: the sidecar watched the one address its
	// --peers names, got a snapshot, and found it to be its own.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		s, _ := os.ReadFile(sp.Log)
		if strings.Contains(string(s), "peer address is this sidecar's own") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the chart's sidecar did not recognize itself among its --peers within 30s:\n%s", s)
		}
	}
	t.Logf("the chart's control and sidecar containers, as processes: the sidecar has its snapshot over mutual TLS (args %v)", sp.Args)
}
