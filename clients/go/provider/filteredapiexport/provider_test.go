package filteredapiexport

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cluster"

	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	syncv1alpha1 "github.com/edge-connect/vwserver/clients/go/provider/apis/v1alpha1"
)

// fakeAPI answers just enough of the Kubernetes API for the generic provider: discovery of one
// resource, and LIST/WATCH of it (plain and watch-list), every watch held open until the client
// leaves. With deny set it answers 403 to everything.
type fakeAPI struct {
	prefix   string // path before the API paths, e.g. /services/x/clusters/*
	group    string
	version  string
	resource string
	kind     string
	items    []map[string]any
	deny     atomic.Bool

	mu    sync.Mutex
	lists int // successful LISTs and watch-lists of the resource
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path, ok := strings.CutPrefix(r.URL.Path, f.prefix)
	if !ok {
		http.NotFound(w, r)
		return
	}
	if f.deny.Load() {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}`))
		return
	}
	gv := f.group + "/" + f.version
	switch path {
	case "/api":
		reply(w, map[string]any{"kind": "APIVersions", "versions": []string{}})
	case "/apis":
		reply(w, map[string]any{"kind": "APIGroupList", "apiVersion": "v1", "groups": []any{map[string]any{
			"name":             f.group,
			"versions":         []any{map[string]any{"groupVersion": gv, "version": f.version}},
			"preferredVersion": map[string]any{"groupVersion": gv, "version": f.version},
		}}})
	case "/apis/" + gv:
		reply(w, map[string]any{"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": []any{map[string]any{
			"name": f.resource, "singularName": strings.ToLower(f.kind), "namespaced": false, "kind": f.kind,
			"verbs": []string{"get", "list", "watch"},
		}}})
	case "/apis/" + gv + "/" + f.resource:
		f.collection(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeAPI) collection(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("watch") != "true" {
		f.count()
		reply(w, map[string]any{"kind": f.kind + "List", "apiVersion": f.group + "/" + f.version,
			"metadata": map[string]any{"resourceVersion": "1"}, "items": f.items})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	if q.Get("sendInitialEvents") == "true" {
		f.count()
		for _, item := range f.items {
			_ = enc.Encode(map[string]any{"type": "ADDED", "object": item})
		}
		_ = enc.Encode(map[string]any{"type": "BOOKMARK", "object": map[string]any{
			"kind": f.kind, "apiVersion": f.group + "/" + f.version,
			"metadata": map[string]any{"resourceVersion": "1", "annotations": map[string]string{"k8s.io/initial-events-end": "true"}},
		}})
	}
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

func (f *fakeAPI) count() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
}

func (f *fakeAPI) listed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lists
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// world is a fake kcp workspace holding the slice "test", whose one endpoint is a fake vwserver
// URL serving apibindings (none) on clusters/*.
func world(t *testing.T) (kcp *httptest.Server, vw *fakeAPI, endpoint string) {
	vw = &fakeAPI{prefix: "/services/filtered-apiexport/c/test/clusters/*", group: "apis.kcp.io", version: "v1alpha1",
		resource: "apibindings", kind: "APIBinding"}
	vwServer := httptest.NewServer(vw)
	t.Cleanup(vwServer.Close)
	endpoint = vwServer.URL + "/services/filtered-apiexport/c/test"
	slices := &fakeAPI{group: "sync.edge-connect.eu", version: "v1alpha1", resource: "filteredapiexportendpointslices",
		kind: "FilteredAPIExportEndpointSlice", items: []map[string]any{{
			"apiVersion": "sync.edge-connect.eu/v1alpha1", "kind": "FilteredAPIExportEndpointSlice",
			"metadata": map[string]any{"name": "test", "resourceVersion": "1"},
			"spec":     map[string]any{"export": map[string]any{"name": "widgets.example.io"}},
			"status":   map[string]any{"endpoints": []any{map[string]any{"url": endpoint}}},
		}}}
	kcp = httptest.NewServer(slices)
	t.Cleanup(kcp.Close)
	return kcp, vw, endpoint
}

type noAware struct{}

func (noAware) Engage(context.Context, multicluster.ClusterName, cluster.Cluster) error { return nil }

func eventually(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *Provider) state() (generation int, failed []string) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for url := range p.failed {
		failed = append(failed, url)
	}
	return p.generation, failed
}

func start(t *testing.T, p *Provider) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Start(ctx, noAware{}) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Start: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Start did not return within 10s of its context's end")
		}
	})
}

// An endpoint that refuses the provider when the slice first lists it is watched once it
// answers: the hook hears the generic provider's failure, the probe sees the recovery, the
// restarted generic provider lists apibindings there.
func TestAFailedEndpointIsWatchedOnceItAnswers(t *testing.T) {
	kcp, vw, endpoint := world(t)
	vw.deny.Store(true)
	log := testr.New(t)
	p, err := New(&rest.Config{Host: kcp.URL}, "test", Options{Log: &log, RetryInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	start(t, p)
	eventually(t, "failure recorded", 10*time.Second, func() bool {
		_, failed := p.state()
		return len(failed) == 1 && failed[0] == endpoint
	})
	time.Sleep(200 * time.Millisecond) // a few probes, all refused
	if gen, _ := p.state(); gen != 1 || vw.listed() != 0 {
		t.Fatalf("restarted (generation %d) or listed (%d) while the endpoint refused", gen, vw.listed())
	}

	vw.deny.Store(false)
	eventually(t, "apibindings listed on the endpoint", 10*time.Second, func() bool { return vw.listed() > 0 })
	gen, failed := p.state()
	if gen != 2 || len(failed) != 0 {
		t.Fatalf("generation %d, failed %v; want 2, none", gen, failed)
	}
}

// Without the retry, multicluster-provider v0.8.0 never comes back to an endpoint that failed
// when first seen. If this fails after an upgrade, the upstream retries by itself: the workaround
// (RetryInterval, hook.go) can go.
func TestWithoutRetryTheGenericProviderNeverComesBack(t *testing.T) {
	kcp, vw, _ := world(t)
	vw.deny.Store(true)
	var failures atomic.Int32
	log := hookEndpointFailures(testr.New(t), func(string, error) { failures.Add(1) })
	p, err := New(&rest.Config{Host: kcp.URL}, "test", Options{Log: &log, RetryInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	start(t, p)
	eventually(t, "the generic provider's failure", 10*time.Second, func() bool { return failures.Load() == 1 })
	vw.deny.Store(false)
	time.Sleep(2 * time.Second)
	if n := vw.listed(); n != 0 {
		t.Fatalf("the endpoint was listed %d times: v0.8.0 retries after all", n)
	}
	if n := failures.Load(); n != 1 {
		t.Fatalf("%d failures; want the one when first seen", n)
	}
}

func TestNewRegistersTheTypesAndRejectsAnEmptyName(t *testing.T) {
	kcp, _, _ := world(t)
	if _, err := New(&rest.Config{Host: kcp.URL}, "", Options{}); err == nil {
		t.Fatal("an empty slice name was accepted")
	}
	p, err := New(&rest.Config{Host: kcp.URL}, "s", Options{Scheme: runtime.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"FilteredAPIExportEndpointSlice", "APIBinding"} {
		found := false
		for gvk := range p.options.Scheme.AllKnownTypes() {
			found = found || gvk.Kind == kind
		}
		if !found {
			t.Errorf("%s not in the scheme", kind)
		}
	}
	if _, err := ExtractURLs(nil); err == nil {
		t.Error("ExtractURLs accepted a non-slice")
	}
}

// A URL that leaves the slice asks for a fresh generic provider (vwserver moves clusters to new
// URLs as shards come and go); URLs added alone do not, nor does a generation that is no longer
// the current one.
func TestAnEndpointLeavingTheSliceRestartsTheProvider(t *testing.T) {
	kcp, _, _ := world(t)
	p, err := New(&rest.Config{Host: kcp.URL}, "test", Options{})
	if err != nil {
		t.Fatal(err)
	}
	slice := func(urls ...string) *syncv1alpha1.FilteredAPIExportEndpointSlice {
		s := &syncv1alpha1.FilteredAPIExportEndpointSlice{}
		for _, url := range urls {
			s.Status.Endpoints = append(s.Status.Endpoints, syncv1alpha1.FilteredAPIExportEndpoint{URL: url})
		}
		return s
	}
	asked := func() string {
		select {
		case url := <-p.gone:
			return url
		default:
			return ""
		}
	}
	current, stale := p.extractor(1), p.extractor(0)
	steps := []struct {
		urls []string
		want string // the URL whose leaving asks for a restart
	}{
		{[]string{"https://vw/plain"}, ""},
		{[]string{"https://vw/plain"}, ""},
		{[]string{"https://vw/plain", "https://vw/shards/b"}, ""},
		{[]string{"https://vw/shards/a", "https://vw/shards/b"}, "https://vw/plain"},
		{[]string{"https://vw/shards/a"}, "https://vw/shards/b"},
	}
	for i, step := range steps {
		got, err := current(slice(step.urls...))
		if err != nil || !slices.Equal(got, step.urls) {
			t.Fatalf("step %d: extracted %v, %v; want %v", i, got, err, step.urls)
		}
		if url := asked(); url != step.want {
			t.Fatalf("step %d: restart asked for %q; want %q", i, url, step.want)
		}
		if _, err := stale(slice(step.urls...)); err != nil {
			t.Fatal(err)
		}
		if url := asked(); url != "" {
			t.Fatalf("step %d: a replaced generation asked for a restart (%q)", i, url)
		}
	}
}
