// Package filteredapiexport is a multicluster-runtime provider for a vwserver
// FilteredAPIExportEndpointSlice: the counterpart of kcp's
// github.com/kcp-dev/multicluster-provider/apiexport for an APIExportEndpointSlice.
//
// New builds it on the generic provider of github.com/kcp-dev/multicluster-provider/pkg/provider
// (v0.8.0): the provider watches the named slice in the workspace cfg points at, reads its
// status.endpoints[].url, watches <url>/clusters/*/…/apibindings to learn which consumer
// workspaces bind the export, engages each one as a cluster and talks to <url>/clusters/<id>.
// Everything a controller reads and writes through an engaged cluster goes through the slice,
// so it sees and writes only objects that match the slice's selector.
//
// Three things a provider needs that the generic provider does not do for you:
//
//   - read access to the slice object in kcp (manifests/rbac/provider-reads-slice.yaml), besides
//     the slice's content grant (manifests/rbac/example-slice-user.yaml);
//   - a rest config that trusts vwserver's serving CA as well as kcp's: the provider reuses cfg
//     for every endpoint and only swaps the host (TrustedConfig);
//   - a retry for endpoints that fail when first seen: v0.8.0 tries an endpoint when the slice
//     lists it and then only when the slice object changes, so an endpoint that failed (vwserver
//     down, its CA not trusted, no content grant yet) stays unwatched (see Options.RetryInterval);
//   - a fresh start when an endpoint leaves the slice: v0.8.0 stops watching it but keeps the
//     clusters it engaged through it, with their stopped caches (see extractor). vwserver's
//     endpoint URLs change under engaged clusters when a slice gains or loses a shard.
package filteredapiexport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	apisv1alpha1 "github.com/kcp-dev/sdk/apis/apis/v1alpha1"

	mcpcache "github.com/kcp-dev/multicluster-provider/pkg/cache"
	"github.com/kcp-dev/multicluster-provider/pkg/handlers"
	"github.com/kcp-dev/multicluster-provider/pkg/provider"

	syncv1alpha1 "github.com/edge-connect/vwserver/clients/go/provider/apis/v1alpha1"
)

// DefaultRetryInterval is how often endpoints that failed when first seen are probed again.
const DefaultRetryInterval = 10 * time.Second

var (
	_ multicluster.Provider         = &Provider{}
	_ multicluster.ProviderRunnable = &Provider{}
)

// Options mirror github.com/kcp-dev/multicluster-provider/apiexport.Options.
type Options struct {
	// Scheme is used for the slice, the engagement objects and every engaged cluster's client.
	// Default: client-go's scheme.Scheme. New adds the slice type and kcp's APIBinding to it
	// when missing.
	Scheme *runtime.Scheme

	// Log is the provider's logger. Default: controller-runtime's, named
	// "filtered-apiexport-cluster-provider".
	Log *logr.Logger

	// ObjectToWatch is what the provider watches on <url>/clusters/* to learn which logical
	// clusters to engage. Default: kcp's APIBinding, engaged once its Ready condition is True.
	ObjectToWatch client.Object

	// AddFilter and UpdateFilter decide whether an added/updated ObjectToWatch engages its
	// cluster. Default (with the default ObjectToWatch): condition Ready is True.
	AddFilter    func(obj client.Object) (bool, error)
	UpdateFilter func(obj client.Object) (bool, error)

	// Handlers are lifecycle handlers run for each ObjectToWatch event.
	Handlers handlers.Handlers

	// RetryInterval: how often an endpoint that the generic provider failed to watch when the
	// slice first listed it (vwserver unreachable, a CA it does not trust, no content grant yet)
	// is probed again; once it answers, the generic provider is restarted, which watches it and
	// re-engages every cluster. 0 means DefaultRetryInterval; negative disables the retry (the
	// plain v0.8.0 behaviour: such an endpoint is only tried again when the slice object changes
	// or the provider restarts).
	RetryInterval time.Duration
}

// Provider is a multicluster-runtime provider whose clusters are the consumer workspaces
// behind one FilteredAPIExportEndpointSlice. Hand it to mcmanager.New; the manager starts it.
type Provider struct {
	cfg       *rest.Config
	sliceName string
	retry     time.Duration
	log       logr.Logger

	options Options

	mu         sync.RWMutex
	current    *provider.Provider
	generation int
	indexes    []index
	failed     map[string]error // endpoints the current generic provider failed to watch
	gone       chan string      // an endpoint the current generic provider watched left the slice
}

type index struct {
	obj     client.Object
	field   string
	extract client.IndexerFunc
}

// New returns a provider for the FilteredAPIExportEndpointSlice sliceName in the kcp workspace
// cfg points at (https://<kcp>/clusters/<workspace>). cfg must trust both kcp's CA and
// vwserver's serving CA (see TrustedConfig), and its identity needs get/list/watch on the slice
// (manifests/rbac/provider-reads-slice.yaml) and the slice's content verbs
// (manifests/rbac/example-slice-user.yaml).
func New(cfg *rest.Config, sliceName string, options Options) (*Provider, error) {
	if sliceName == "" {
		return nil, errors.New("filteredapiexport: empty slice name")
	}
	if options.Scheme == nil {
		options.Scheme = scheme.Scheme
	}
	if options.ObjectToWatch == nil {
		options.ObjectToWatch = &apisv1alpha1.APIBinding{}
		if options.AddFilter == nil {
			options.AddFilter = provider.ConditionReadyFunc("Ready")
		}
		if options.UpdateFilter == nil {
			options.UpdateFilter = provider.ConditionReadyFunc("Ready")
		}
	}
	if err := ensureRegistered(options.Scheme, &syncv1alpha1.FilteredAPIExportEndpointSlice{}, syncv1alpha1.AddToScheme); err != nil {
		return nil, err
	}
	if _, ok := options.ObjectToWatch.(*apisv1alpha1.APIBinding); ok {
		if err := ensureRegistered(options.Scheme, options.ObjectToWatch, apisv1alpha1.AddToScheme); err != nil {
			return nil, err
		}
	}
	if options.Log == nil {
		l := log.Log.WithName("filtered-apiexport-cluster-provider")
		options.Log = &l
	}
	retry := options.RetryInterval
	if retry == 0 {
		retry = DefaultRetryInterval
	}

	p := &Provider{
		cfg:       rest.CopyConfig(cfg),
		sliceName: sliceName,
		retry:     retry,
		log:       *options.Log,
		options:   options,
		failed:    map[string]error{},
		gone:      make(chan string, 1),
	}
	// Build the first generic provider now, so that a bad config fails here (as apiexport.New).
	inner, err := provider.NewProvider(p.cfg, sliceName, p.genericOptions(1))
	if err != nil {
		return nil, err
	}
	p.current, p.generation = inner, 1
	return p, nil
}

// genericOptions are the generic provider's options for one generation; its log hook reports
// endpoints it failed to watch (see hook.go).
func (p *Provider) genericOptions(generation int) provider.Options {
	hooked := hookEndpointFailures(*p.options.Log, func(url string, err error) {
		p.endpointFailed(generation, url, err)
	})
	return provider.Options{
		Scheme:                       p.options.Scheme,
		EndpointSliceObject:          &syncv1alpha1.FilteredAPIExportEndpointSlice{},
		ExtractURLsFromEndpointSlice: p.extractor(generation),
		ObjectToWatch:                p.options.ObjectToWatch,
		Log:                          &hooked,
		AddFilter:                    p.options.AddFilter,
		UpdateFilter:                 p.options.UpdateFilter,
		Handlers:                     p.options.Handlers,
	}
}

// extractor is the URL extractor of one generation of the generic provider: ExtractURLs, and a
// restart of that generation (see supervise) once a URL it extracted before is no longer in the
// slice.
//
// v0.8.0's endpointSliceUpdate stops watching a URL that left the slice but never disengages the
// clusters it engaged through it: they stay engaged with that URL and its stopped cache. And a
// URL that the slice lists anew skips every cluster engaged already. vwserver's URLs do change
// under engaged clusters: a slice with one shard lists its plain URL, with two shards one
// /shards/<id> URL each, so the first binding on a second shard moves every engaged cluster to a
// new URL, and the last binding there going removes its URL (possibly before the provider has
// seen that binding's deletion, which is what disengages a cluster). A fresh generic provider
// watches exactly the slice's URLs and engages what each shows now.
func (p *Provider) extractor(generation int) provider.URLExtractor {
	var mu sync.Mutex
	var last []string
	return func(obj client.Object) ([]string, error) {
		urls, err := ExtractURLs(obj)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		gone := ""
		for _, url := range last {
			if !slices.Contains(urls, url) {
				gone = url
				break
			}
		}
		last = urls
		mu.Unlock()
		if gone != "" {
			p.endpointGone(generation, gone)
		}
		return urls, nil
	}
}

// endpointGone asks supervise to restart the generic provider of generation, if it is the current
// one, because url left the slice.
func (p *Provider) endpointGone(generation int, url string) {
	p.mu.RLock()
	current := generation == p.generation
	p.mu.RUnlock()
	if !current {
		return
	}
	p.log.Info("an endpoint left the slice; restarting the provider on the slice's endpoints", "url", url)
	select {
	case p.gone <- url:
	default: // a restart is requested already
	}
}

func ensureRegistered(s *runtime.Scheme, obj runtime.Object, add func(*runtime.Scheme) error) error {
	if _, _, err := s.ObjectKinds(obj); err == nil {
		return nil
	}
	if err := add(s); err != nil {
		return fmt.Errorf("filteredapiexport: registering %T: %w", obj, err)
	}
	return nil
}

// ExtractURLs is the URL extractor for a FilteredAPIExportEndpointSlice: its
// status.endpoints[].url.
func ExtractURLs(obj client.Object) ([]string, error) {
	s, ok := obj.(*syncv1alpha1.FilteredAPIExportEndpointSlice)
	if !ok {
		return nil, fmt.Errorf("filteredapiexport: %T is not a FilteredAPIExportEndpointSlice", obj)
	}
	return s.URLs(), nil
}

// Get returns an engaged cluster (a consumer workspace, by logical-cluster ID).
func (p *Provider) Get(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error) {
	return p.inner().Get(ctx, name)
}

// IndexField adds an index to every engaged cluster, now and after a restart.
func (p *Provider) IndexField(ctx context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	p.mu.Lock()
	p.indexes = append(p.indexes, index{obj: obj, field: field, extract: extract})
	inner := p.current
	p.mu.Unlock()
	return inner.IndexField(ctx, obj, field, extract)
}

// Lister lists objects across the caches of all watched endpoints (shards).
func (p *Provider) Lister() mcpcache.Lister {
	return listerFunc(func(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
		return p.inner().Lister().List(ctx, list, opts...)
	})
}

type listerFunc func(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error

func (f listerFunc) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return f(ctx, list, opts...)
}

func (p *Provider) inner() *provider.Provider {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.current
}

// Start runs the provider until ctx ends (the multicluster manager calls it). It runs the
// generic provider; while an endpoint that the generic provider failed to watch does not
// answer, nothing changes; once it answers, or once an endpoint leaves the slice, the generic
// provider is replaced by a fresh one, which watches every endpoint of the slice anew (engaged
// clusters are re-engaged).
func (p *Provider) Start(ctx context.Context, aware multicluster.Aware) error {
	for {
		p.mu.RLock()
		inner := p.current
		p.mu.RUnlock()

		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- inner.Start(runCtx, aware) }()
		restart, err, finished := p.supervise(runCtx, done)
		cancel()
		if !finished {
			err = <-done
		}
		if ctx.Err() != nil || !restart {
			return err
		}
		if err := p.nextGeneration(ctx); err != nil {
			return err
		}
	}
}

// nextGeneration replaces the generic provider with a fresh one (the indexes replayed).
func (p *Provider) nextGeneration(ctx context.Context) error {
	p.mu.RLock()
	generation := p.generation + 1 // only Start changes it
	indexes := append([]index(nil), p.indexes...)
	p.mu.RUnlock()
	inner, err := provider.NewProvider(p.cfg, p.sliceName, p.genericOptions(generation))
	if err != nil {
		return err
	}
	for _, ix := range indexes {
		if err := inner.IndexField(ctx, ix.obj, ix.field, ix.extract); err != nil {
			return err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ix := range p.indexes[len(indexes):] { // added meanwhile
		if err := inner.IndexField(ctx, ix.obj, ix.field, ix.extract); err != nil {
			return err
		}
	}
	p.current, p.generation = inner, generation
	clear(p.failed)
	select {
	case <-p.gone: // requested by the generation just replaced
	default:
	}
	p.log.Info("restarted the provider", "slice", p.sliceName, "generation", generation)
	return nil
}

// supervise waits until ctx ends, the generic provider returns (finished), an endpoint it
// failed to watch answers a probe, or an endpoint it watched left the slice (restart).
func (p *Provider) supervise(ctx context.Context, done <-chan error) (restart bool, err error, finished bool) {
	var tick <-chan time.Time
	if p.retry > 0 {
		t := time.NewTicker(p.retry)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return false, nil, false
		case err := <-done:
			return false, err, true
		case <-p.gone:
			return true, nil, false
		case <-tick:
			p.mu.RLock()
			failed := make([]string, 0, len(p.failed))
			for url := range p.failed {
				failed = append(failed, url)
			}
			p.mu.RUnlock()
			for _, url := range failed {
				if err := probe(ctx, p.cfg, url, p.options.ObjectToWatch, p.options.Scheme); err != nil {
					p.log.V(1).Info("endpoint still fails", "url", url, "error", err.Error())
					continue
				}
				p.log.Info("endpoint answers now", "url", url)
				return true, nil, false
			}
		}
	}
}

// endpointFailed records that the generic provider of a generation failed to watch url (called
// through the log hook, from that provider's informer goroutine).
func (p *Provider) endpointFailed(generation int, url string, err error) {
	if p.retry < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if generation != p.generation {
		return // a provider that is being replaced
	}
	p.failed[url] = err
	p.log.Info("endpoint failed when first seen; probing it again periodically", "url", url, "every", p.retry.String())
}
