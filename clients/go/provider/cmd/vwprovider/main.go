// Command vwprovider is an example provider controller on multicluster-runtime that serves the
// consumer workspaces behind one vwserver FilteredAPIExportEndpointSlice (package
// filteredapiexport), and vwserver's e2e test client for it (tests/e2e/test_provider_kcp.py).
//
// Its reconciler, for every object of one kind that the slice shows in any engaged workspace:
// adds a finalizer, sets status.phase, and removes the finalizer once the object is deleted.
//
//	vwprovider --kubeconfig provider.kubeconfig --slice prod-widgets --vwserver-ca vwserver-ca.crt
//
// The kubeconfig points at the slice's workspace in kcp (https://<kcp>/clusters/<workspace>);
// its identity needs manifests/rbac/provider-reads-slice.yaml and the slice's content grant.
// Everything a test reads goes to stdout as JSON lines (see out.go); logs go to stderr. It stops
// cleanly on SIGTERM or SIGINT (exit code 0).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/edge-connect/vwserver/clients/go/provider/filteredapiexport"
)

const clusterAnnotation = "kcp.io/cluster"

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("vwprovider", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the provider identity, pointing at the slice's workspace in kcp (required)")
	kubecontext := fs.String("context", "", "kubeconfig context (default: its current one)")
	sliceName := fs.String("slice", "", "name of the FilteredAPIExportEndpointSlice (required)")
	kcpCA := fs.String("kcp-ca", "", "kcp's CA bundle (default: the kubeconfig's)")
	vwserverCA := fs.String("vwserver-ca", "", "vwserver's serving CA bundle (required)")
	kind := fs.String("kind", "example.io/v1alpha1/Widget", "group/version/Kind to reconcile")
	finalizer := fs.String("finalizer", "example.io/vwprovider", "finalizer to add and remove")
	phase := fs.String("status-phase", "Reconciled", "value the reconciler writes to status.phase")
	retry := fs.Duration("retry-interval", filteredapiexport.DefaultRetryInterval, "how often an endpoint that failed when first seen is probed again (negative: never)")
	qps := fs.Float64("qps", 50, "client-side rate limit per client (requests per second; burst twice that)")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	gvk, err := parseGVK(*kind)
	if err != nil || *kubeconfig == "" || *sliceName == "" || *vwserverCA == "" {
		fmt.Fprintf(os.Stderr, "vwprovider: --kubeconfig, --slice, --vwserver-ca are required; --kind is group/version/Kind (%v)\n", err)
		return 2
	}
	out := newJSONLines(os.Stdout)
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))

	// 1. The rest config: kcp's kubeconfig, trusting vwserver's serving CA as well.
	loader := &clientcmd.ClientConfigLoadingRules{ExplicitPath: *kubeconfig}
	overrides := &clientcmd.ConfigOverrides{CurrentContext: *kubecontext}
	base, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loader, overrides).ClientConfig()
	if err != nil {
		fmt.Fprintf(os.Stderr, "vwprovider: --kubeconfig: %v\n", err)
		return 2
	}
	cfg, err := filteredapiexport.TrustedConfig(base, *kcpCA, *vwserverCA)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vwprovider: %v\n", err)
		return 2
	}
	cfg.QPS, cfg.Burst = float32(*qps), int(2**qps)
	cfg.UserAgent = "vwprovider"
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &requestLogger{next: rt, out: out} })

	// 2. The provider for the slice, and a multicluster manager around it.
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		fmt.Fprintf(os.Stderr, "vwprovider: %v\n", err)
		return 1
	}
	provider, err := filteredapiexport.New(cfg, *sliceName, filteredapiexport.Options{Scheme: scheme, RetryInterval: *retry})
	if err != nil {
		fmt.Fprintf(os.Stderr, "vwprovider: provider: %v\n", err)
		return 1
	}
	mgr, err := mcmanager.New(cfg, provider, ctrl.Options{
		Scheme:                 scheme,
		LeaderElection:         false,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "vwprovider: manager: %v\n", err)
		return 1
	}
	if err := mgr.Add(&engagements{out: out}); err != nil {
		fmt.Fprintf(os.Stderr, "vwprovider: %v\n", err)
		return 1
	}

	// 3. The controller.
	r := &reconciler{mgr: mgr, gvk: gvk, finalizer: *finalizer, phase: *phase, out: out}
	skip := true
	err = mcbuilder.ControllerManagedBy(mgr).
		Named("vwprovider").
		For(r.newObject()).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{SkipNameValidation: &skip}).
		Complete(r)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vwprovider: controller: %v\n", err)
		return 1
	}

	ctx := ctrl.SetupSignalHandler() // SIGTERM/SIGINT: stop; a second one exits at once
	out.emit(map[string]any{"event": "start", "server": base.Host, "slice": *sliceName, "kind": gvk.String()})
	if err := mgr.Start(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "vwprovider: %v\n", err)
		return 1
	}
	out.emit(map[string]any{"event": "stopped"})
	return 0
}

// engagements reports every cluster the manager engages, and when that engagement ends.
type engagements struct{ out *jsonLines }

func (e *engagements) Start(ctx context.Context) error { <-ctx.Done(); return nil }

func (e *engagements) Engage(ctx context.Context, name multicluster.ClusterName, cl cluster.Cluster) error {
	e.out.emit(map[string]any{"event": "engaged", "cluster": string(name), "server": cl.GetConfig().Host})
	go func() {
		<-ctx.Done()
		e.out.emit(map[string]any{"event": "disengaged", "cluster": string(name)})
	}()
	return nil
}

type reconciler struct {
	mgr       mcmanager.Manager
	gvk       schema.GroupVersionKind
	finalizer string
	phase     string
	out       *jsonLines
}

func (r *reconciler) newObject() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(r.gvk)
	return u
}

func (r *reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (ctrl.Result, error) {
	line := map[string]any{
		"event": "reconcile", "cluster": string(req.ClusterName),
		"namespace": req.Namespace, "name": req.Name, "writes": []map[string]string{},
	}
	actions := []string{}
	err := r.reconcile(ctx, req, line, &actions)
	line["actions"] = actions
	if err != nil {
		line["error"] = err.Error()
	}
	r.out.emit(line)
	return ctrl.Result{}, err // an error requeues with backoff
}

func (r *reconciler) reconcile(ctx context.Context, req mcreconcile.Request, line map[string]any, actions *[]string) error {
	cl, err := r.mgr.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	c := cl.GetClient()
	obj := r.newObject()
	// Unstructured reads go to the server (controller-runtime's default): the slice's GET.
	if err := c.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			*actions = append(*actions, "gone")
			return nil
		}
		return err
	}
	line["labels"] = nonNil(obj.GetLabels())
	line["objectCluster"] = obj.GetAnnotations()[clusterAnnotation]

	if obj.GetDeletionTimestamp() != nil {
		if !controllerutil.ContainsFinalizer(obj, r.finalizer) {
			*actions = append(*actions, "deleting")
			return nil
		}
		controllerutil.RemoveFinalizer(obj, r.finalizer)
		if err := c.Update(ctx, obj); err != nil {
			return fmt.Errorf("remove finalizer: %w", err)
		}
		*actions = append(*actions, "finalizer-removed")
		wrote(line, "finalizer-removed", obj)
		return nil
	}
	if !controllerutil.ContainsFinalizer(obj, r.finalizer) {
		controllerutil.AddFinalizer(obj, r.finalizer)
		if err := c.Update(ctx, obj); err != nil {
			return fmt.Errorf("add finalizer: %w", err)
		}
		*actions = append(*actions, "finalizer-added")
		wrote(line, "finalizer-added", obj)
	}
	if current, _, _ := unstructured.NestedString(obj.Object, "status", "phase"); current != r.phase {
		before := obj.DeepCopy()
		if err := unstructured.SetNestedField(obj.Object, r.phase, "status", "phase"); err != nil {
			return err
		}
		if err := c.Status().Patch(ctx, obj, client.MergeFrom(before)); err != nil {
			return fmt.Errorf("patch status: %w", err)
		}
		*actions = append(*actions, "status-patched")
		wrote(line, "status-patched", obj)
	}
	if len(*actions) == 0 {
		*actions = append(*actions, "noop")
	}
	return nil
}

func wrote(line map[string]any, action string, obj *unstructured.Unstructured) {
	writes, _ := line["writes"].([]map[string]string)
	line["writes"] = append(writes, map[string]string{"action": action, "resourceVersion": obj.GetResourceVersion()})
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// parseGVK parses group/version/Kind ("example.io/v1alpha1/Widget"; core: "v1/ConfigMap").
func parseGVK(s string) (schema.GroupVersionKind, error) {
	parts := strings.Split(s, "/")
	switch len(parts) {
	case 2:
		return schema.GroupVersionKind{Version: parts[0], Kind: parts[1]}, nil
	case 3:
		return schema.GroupVersionKind{Group: parts[0], Version: parts[1], Kind: parts[2]}, nil
	}
	return schema.GroupVersionKind{}, fmt.Errorf("%q is not group/version/Kind", s)
}
