package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// clusterAnnotation is where kcp names an object's logical cluster.
const clusterAnnotation = "kcp.io/cluster"

// runInformer runs one informer until SIGTERM/SIGINT or --duration, printing
//
//	{"event":"start", ...}                     the effective settings
//	{"event":"request", ...}                   every HTTP request (see requestLogger)
//	{"event":"add"|"update"|"delete", ...}     one line per event handler call
//	{"event":"synced", "count": N}             once the initial list/watch-list is processed
//	{"event":"cache", "items": [...]}          at the end: the whole cache
func runInformer(args []string) int {
	fs := flag.NewFlagSet("informer", flag.ContinueOnError)
	conn := addConnFlags(fs)
	resource := fs.String("resource", "example.io/v1alpha1/widgets", "group/version/resource to inform on")
	namespace := fs.String("namespace", "", "only this namespace (not on clusters/*: kcp refuses namespaced wildcard requests)")
	labelSelector := fs.String("label-selector", "", "client-side label selector, sent with every list and watch")
	clusterAware := fs.Bool("cluster-aware", false, "key objects by <kcp.io/cluster>|<namespace>/<name> (for clusters/*)")
	watchList := fs.String("watch-list", "default", "client-go's WatchListClient feature: on, off or default")
	duration := fs.Duration("duration", 0, "stop after this long (0: run until SIGTERM/SIGINT)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// The gate must be set before any reflector is built (the reflector reads it once).
	if err := setWatchList(*watchList); err != nil {
		fmt.Fprintf(os.Stderr, "vwclient informer: --watch-list: %v\n", err)
		return 2
	}
	gvr, err := parseGVR(*resource)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vwclient informer: --resource: %v\n", err)
		return 2
	}
	out := newJSONLines(os.Stdout)
	cfg, err := conn.restConfig(out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vwclient informer: %v\n", err)
		return 2
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vwclient informer: %v\n", err)
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}

	keyFunc := cache.MetaNamespaceKeyFunc
	if *clusterAware {
		keyFunc = clusterAwareKey
	}
	out.emit(map[string]any{
		"event":        "start",
		"server":       cfg.Host,
		"resource":     gvr.String(),
		"clusterAware": *clusterAware,
		"watchList":    clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient),
	})

	tweak := func(o *metav1.ListOptions) {
		if *labelSelector != "" {
			o.LabelSelector = *labelSelector
		}
	}
	ri := client.Resource(gvr).Namespace(*namespace)
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return ri.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return ri.Watch(ctx, o)
		},
	}, client)

	inf := newInformer(lw, keyFunc, &printingHandler{out: out, keyFunc: keyFunc})
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), inf.controller.HasSynced) {
			out.emit(map[string]any{"event": "synced", "count": len(inf.store.ListKeys())})
		}
	}()
	inf.controller.RunWithContext(ctx) // returns once ctx is done and the reflector has stopped

	items := []map[string]any{}
	for _, obj := range inf.store.List() {
		key, _ := keyFunc(obj)
		items = append(items, describe(key, obj))
	}
	sort.Slice(items, func(i, j int) bool { return items[i]["key"].(string) < items[j]["key"].(string) })
	out.emit(map[string]any{
		"event":  "cache",
		"synced": inf.controller.HasSynced(),
		"count":  len(items),
		"items":  items,
		"reason": context.Cause(ctx).Error(),
	})
	return 0
}

// setWatchList turns client-go's WatchListClient feature on or off through client-go's feature
// gate API (what KUBE_FEATURE_WatchListClient=true|false does via the environment; a Set wins
// over the environment).
func setWatchList(mode string) error {
	var on bool
	switch mode {
	case "default":
		return nil
	case "on":
		on = true
	case "off":
		on = false
	default:
		return fmt.Errorf("%q: want on, off or default", mode)
	}
	gates, ok := clientfeatures.FeatureGates().(interface {
		Set(clientfeatures.Feature, bool) error
	})
	if !ok {
		return errors.New("client-go's feature gates cannot be set in this build")
	}
	return gates.Set(clientfeatures.WatchListClient, on)
}

// clusterAwareKey keys objects by "<kcp.io/cluster>|<namespace>/<name>", so that same-named
// objects of different logical clusters on clusters/* do not overwrite each other.
func clusterAwareKey(obj any) (string, error) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Key, nil
	}
	key, err := cache.MetaNamespaceKeyFunc(obj)
	if err != nil {
		return "", err
	}
	m, err := metaOf(obj)
	if err != nil {
		return "", err
	}
	return m.GetAnnotations()[clusterAnnotation] + "|" + key, nil
}

func metaOf(obj any) (metav1.Object, error) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("object of type %T has no metadata", obj)
	}
	return m, nil
}

// informer is client-go's informer machinery (reflector, in-order FIFO, indexer) assembled by
// hand, because client-go's constructors fix the store key to <namespace>/<name>.
type informer struct {
	store      cache.Indexer
	controller cache.Controller
}

func newInformer(lw cache.ListerWatcher, keyFunc cache.KeyFunc, h cache.ResourceEventHandler) *informer {
	deletionHandlingKey := func(obj any) (string, error) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			return d.Key, nil
		}
		return keyFunc(obj)
	}
	store := cache.NewIndexer(deletionHandlingKey, cache.Indexers{})
	logger := klog.Background()
	fifo := cache.NewRealFIFOWithOptions(cache.RealFIFOOptions{
		Logger:       &logger,
		Name:         "vwclient",
		KeyFunction:  keyFunc,
		KnownObjects: store,
	})
	ctrl := cache.New(&cache.Config{
		Queue:         fifo,
		ListerWatcher: lw,
		ObjectType:    &unstructured.Unstructured{},
		Process: func(obj any, isInInitialList bool) error {
			deltas, ok := obj.(cache.Deltas)
			if !ok {
				return fmt.Errorf("expected Deltas, got %T", obj)
			}
			return processDeltas(h, store, deltas, isInInitialList)
		},
	})
	return &informer{store: store, controller: ctrl}
}

// processDeltas applies deltas to the store and calls the handler, as client-go's informers do.
func processDeltas(h cache.ResourceEventHandler, store cache.Store, deltas cache.Deltas, isInInitialList bool) error {
	for _, d := range deltas {
		switch d.Type {
		case cache.Sync, cache.Replaced, cache.Added, cache.Updated:
			if old, exists, err := store.Get(d.Object); err == nil && exists {
				if err := store.Update(d.Object); err != nil {
					return err
				}
				h.OnUpdate(old, d.Object)
			} else {
				if err := store.Add(d.Object); err != nil {
					return err
				}
				h.OnAdd(d.Object, isInInitialList)
			}
		case cache.Deleted:
			if err := store.Delete(d.Object); err != nil {
				return err
			}
			h.OnDelete(d.Object)
		}
	}
	return nil
}

// printingHandler prints one JSON line per handler call.
type printingHandler struct {
	out     *jsonLines
	keyFunc cache.KeyFunc
}

func (p *printingHandler) line(event string, obj any) map[string]any {
	key, err := p.keyFunc(obj)
	if err != nil {
		key = "error: " + err.Error()
	}
	line := describe(key, obj)
	line["event"] = event
	return line
}

func (p *printingHandler) OnAdd(obj any, isInInitialList bool) {
	line := p.line("add", obj)
	line["initial"] = isInInitialList
	p.out.emit(line)
}

func (p *printingHandler) OnUpdate(oldObj, newObj any) {
	line := p.line("update", newObj)
	if m, err := metaOf(oldObj); err == nil {
		line["oldResourceVersion"] = m.GetResourceVersion()
		line["oldLabels"] = nonNil(m.GetLabels())
	}
	p.out.emit(line)
}

func (p *printingHandler) OnDelete(obj any) {
	line := p.line("delete", obj)
	_, unknown := obj.(cache.DeletedFinalStateUnknown)
	line["finalStateUnknown"] = unknown
	p.out.emit(line)
}

// describe is what the tests compare: identity, resourceVersion, labels, and what decides
// which slice may see the object (finalizers, annotations, deletionTimestamp).
func describe(key string, obj any) map[string]any {
	line := map[string]any{"key": key}
	m, err := metaOf(obj)
	if err != nil {
		line["error"] = err.Error()
		return line
	}
	line["cluster"] = m.GetAnnotations()[clusterAnnotation]
	line["namespace"] = m.GetNamespace()
	line["name"] = m.GetName()
	line["resourceVersion"] = m.GetResourceVersion()
	line["labels"] = nonNil(m.GetLabels())
	describeLifecycle(line, m)
	return line
}

// describeLifecycle adds the object's finalizers, annotations and deletionTimestamp (RFC 3339,
// "" while the object is not being deleted) to line.
func describeLifecycle(line map[string]any, m metav1.Object) {
	finalizers := m.GetFinalizers()
	if finalizers == nil {
		finalizers = []string{}
	}
	line["finalizers"] = finalizers
	line["annotations"] = nonNil(m.GetAnnotations())
	line["deletionTimestamp"] = ""
	if ts := m.GetDeletionTimestamp(); ts != nil {
		line["deletionTimestamp"] = ts.UTC().Format(time.RFC3339)
	}
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}
