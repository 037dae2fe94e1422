package filteredapiexport

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// probeTimeout bounds one probe of an endpoint.
const probeTimeout = 10 * time.Second

// probe does what the generic provider's first step on an endpoint does and what fails when
// vwserver is unreachable, untrusted or refuses the caller: map ObjectToWatch's kind through
// discovery on <url>/clusters/*, with the provider's own config.
func probe(ctx context.Context, cfg *rest.Config, url string, obj client.Object, scheme *runtime.Scheme) error {
	cfg = rest.CopyConfig(cfg)
	cfg.Host = strings.TrimSuffix(url, "/") + "/clusters/*"
	cfg.Timeout = probeTimeout
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	defer httpClient.CloseIdleConnections()
	gvk, err := apiutil.GVKForObject(obj, scheme)
	if err != nil {
		return err
	}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, httpClient)
	if err != nil {
		return err
	}
	result := make(chan error, 1)
	go func() {
		_, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		result <- err
	}()
	select {
	case err := <-result:
		if err != nil {
			return fmt.Errorf("mapping %s on %s: %w", gvk, cfg.Host, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
