package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// runReconciler runs a controller-runtime manager (no leader election, no metrics or health
// endpoints) with one controller for an unstructured kind on ONE logical cluster (a
// .../clusters/<id> URL; controller-runtime cannot use clusters/*). Its reconciler adds a
// finalizer, sets status.phase, and removes the finalizer once the object is being deleted.
// It prints
//
//	{"event":"request", ...}     every HTTP request (see requestLogger)
//	{"event":"synced"}           once the manager's caches have synced
//	{"event":"reconcile", ...}   one line per Reconcile call: name, labels, finalizers,
//	                             annotations, deletionTimestamp (as read), actions, the
//	                             resourceVersion each write produced, error
func runReconciler(args []string) int {
	fs := flag.NewFlagSet("reconciler", flag.ContinueOnError)
	conn := addConnFlags(fs)
	kind := fs.String("kind", "example.io/v1alpha1/Widget", "group/version/Kind to reconcile")
	namespace := fs.String("namespace", "", "watch only this namespace (default: all)")
	finalizer := fs.String("finalizer", "example.io/test-finalizer", "finalizer to add and remove")
	phase := fs.String("status-phase", "Reconciled", "value the reconciler writes to status.phase")
	labelSelector := fs.String("label-selector", "",
		"the cache's own label selector for the kind (controller-runtime cache.ByObject Label; "+
			"its informer lists and watches with labelSelector=...)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	gvk, err := parseGVK(*kind)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vwclient reconciler: --kind: %v\n", err)
		return 2
	}
	out := newJSONLines(os.Stdout)
	cfg, err := conn.restConfig(out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vwclient reconciler: %v\n", err)
		return 2
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))

	opts := ctrl.Options{
		LeaderElection:         false,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	}
	if *namespace != "" {
		opts.Cache.DefaultNamespaces = map[string]cache.Config{*namespace: {}}
	}
	r := &reconciler{gvk: gvk, finalizer: *finalizer, phase: *phase, out: out}
	if *labelSelector != "" {
		selector, err := labels.Parse(*labelSelector)
		if err != nil {
			fmt.Fprintf(os.Stderr, "vwclient reconciler: --label-selector: %v\n", err)
			return 2
		}
		opts.Cache.ByObject = map[client.Object]cache.ByObject{r.newObject(): {Label: selector}}
	}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vwclient reconciler: manager: %v\n", err)
		return 1
	}
	r.client = mgr.GetClient()
	skip := true
	err = ctrl.NewControllerManagedBy(mgr).
		For(r.newObject()).
		Named("vwclient").
		WithOptions(controller.Options{SkipNameValidation: &skip}).
		Complete(r)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vwclient reconciler: controller: %v\n", err)
		return 1
	}
	ctx := ctrl.SetupSignalHandler() // SIGTERM/SIGINT: stop; a second one exits at once
	go func() {
		if mgr.GetCache().WaitForCacheSync(ctx) {
			out.emit(map[string]any{"event": "synced"})
		}
	}()
	out.emit(map[string]any{"event": "start", "server": cfg.Host, "kind": gvk.String()})
	if err := mgr.Start(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "vwclient reconciler: %v\n", err)
		return 1
	}
	out.emit(map[string]any{"event": "stopped"})
	return 0
}

type reconciler struct {
	client    client.Client
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

func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	line := map[string]any{"event": "reconcile", "namespace": req.Namespace, "name": req.Name}
	actions := []string{}
	err := r.reconcile(ctx, req, line, &actions)
	line["actions"] = actions
	if line["writes"] == nil {
		line["writes"] = []map[string]string{}
	}
	if err != nil {
		line["error"] = err.Error()
	}
	r.out.emit(line)
	return ctrl.Result{}, err // an error requeues with backoff
}

func (r *reconciler) reconcile(ctx context.Context, req ctrl.Request, line map[string]any, actions *[]string) error {
	obj := r.newObject()
	// Unstructured reads go to the server (controller-runtime's default): the slice's GET.
	if err := r.client.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			*actions = append(*actions, "gone")
			return nil
		}
		return err
	}
	line["labels"] = nonNil(obj.GetLabels())
	line["cluster"] = obj.GetAnnotations()[clusterAnnotation]
	line["resourceVersion"] = obj.GetResourceVersion()
	describeLifecycle(line, obj)

	if obj.GetDeletionTimestamp() != nil {
		if !controllerutil.ContainsFinalizer(obj, r.finalizer) {
			*actions = append(*actions, "deleting")
			return nil
		}
		controllerutil.RemoveFinalizer(obj, r.finalizer)
		if err := r.client.Update(ctx, obj); err != nil {
			return fmt.Errorf("remove finalizer: %w", err)
		}
		*actions = append(*actions, "finalizer-removed")
		wrote(line, "finalizer-removed", obj)
		return nil
	}

	if !controllerutil.ContainsFinalizer(obj, r.finalizer) {
		controllerutil.AddFinalizer(obj, r.finalizer)
		if err := r.client.Update(ctx, obj); err != nil { // PUT, conditional on resourceVersion
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
		if err := r.client.Status().Patch(ctx, obj, client.MergeFrom(before)); err != nil {
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

// wrote records the resourceVersion a successful write returned, so that a test can tell the
// reconciler's writes from others in a watch stream.
func wrote(line map[string]any, action string, obj *unstructured.Unstructured) {
	writes, _ := line["writes"].([]map[string]string)
	line["writes"] = append(writes, map[string]string{"action": action, "resourceVersion": obj.GetResourceVersion()})
}
