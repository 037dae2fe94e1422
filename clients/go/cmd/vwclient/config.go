package main

import (
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// connFlags say where the server is and who we are: a kubeconfig (with optional overrides, as
// kubectl's --server/--token) or explicit --server/--token/--ca.
type connFlags struct {
	kubeconfig string
	context    string
	server     string
	token      string
	ca         string
	insecure   bool
	qps        float64
}

func addConnFlags(fs *flag.FlagSet) *connFlags {
	c := &connFlags{}
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: none; then --server is required)")
	fs.StringVar(&c.context, "context", "", "kubeconfig context (default: its current context)")
	fs.StringVar(&c.server, "server", "", "server URL, e.g. <vwserver>/services/filtered-apiexport/<c>/<slice>/clusters/*")
	fs.StringVar(&c.token, "token", "", "bearer token")
	fs.StringVar(&c.ca, "ca", "", "CA bundle file for the server's certificate")
	fs.BoolVar(&c.insecure, "insecure-skip-tls-verify", false, "do not verify the server's certificate")
	fs.Float64Var(&c.qps, "qps", 200, "client-side rate limit (requests per second; burst is twice that)")
	klog.InitFlags(fs) // -v, -logtostderr, ...
	return c
}

func (c *connFlags) restConfig(out *jsonLines) (*rest.Config, error) {
	var cfg *rest.Config
	if c.kubeconfig != "" {
		overrides := &clientcmd.ConfigOverrides{CurrentContext: c.context}
		overrides.ClusterInfo.Server = c.server
		overrides.ClusterInfo.CertificateAuthority = c.ca
		overrides.ClusterInfo.InsecureSkipTLSVerify = c.insecure
		overrides.AuthInfo.Token = c.token
		loader := &clientcmd.ClientConfigLoadingRules{ExplicitPath: c.kubeconfig}
		var err error
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loader, overrides).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig: %w", err)
		}
	} else {
		if c.server == "" {
			return nil, errors.New("--server or --kubeconfig is required")
		}
		cfg = &rest.Config{
			Host:            c.server,
			BearerToken:     c.token,
			TLSClientConfig: rest.TLSClientConfig{CAFile: c.ca, Insecure: c.insecure},
		}
	}
	cfg.QPS = float32(c.qps)
	cfg.Burst = int(2 * c.qps)
	cfg.UserAgent = "vwclient"
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &requestLogger{next: rt, out: out} })
	return cfg, nil
}

// parseGVR parses group/version/resource ("example.io/v1alpha1/widgets"; core: "v1/pods").
func parseGVR(s string) (schema.GroupVersionResource, error) {
	parts := strings.Split(s, "/")
	switch len(parts) {
	case 2:
		return schema.GroupVersionResource{Version: parts[0], Resource: parts[1]}, nil
	case 3:
		return schema.GroupVersionResource{Group: parts[0], Version: parts[1], Resource: parts[2]}, nil
	}
	return schema.GroupVersionResource{}, fmt.Errorf("%q is not group/version/resource", s)
}

// parseGVK parses group/version/Kind ("example.io/v1alpha1/Widget"; core: "v1/Pod").
func parseGVK(s string) (schema.GroupVersionKind, error) {
	gvr, err := parseGVR(s)
	if err != nil {
		return schema.GroupVersionKind{}, fmt.Errorf("%q is not group/version/Kind", s)
	}
	return schema.GroupVersionKind{Group: gvr.Group, Version: gvr.Version, Kind: gvr.Resource}, nil
}
