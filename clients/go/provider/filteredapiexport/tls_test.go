package filteredapiexport

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// server is an HTTPS server on 127.0.0.1 whose certificate ca issued.
func (ca testCA) server(t *testing.T) *httptest.Server {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	s.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

func write(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func get(cfg *rest.Config, url string) error {
	c, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// The provider reuses one config for kcp and, host swapped, for vwserver: it must trust both.
func TestTrustedConfigTrustsKcpAndVwserver(t *testing.T) {
	kcpCA, vwCA := newCA(t, "kcp"), newCA(t, "vwserver")
	kcp, vw := kcpCA.server(t), vwCA.server(t)
	kcpFile, vwFile := write(t, "kcp.crt", kcpCA.pem), write(t, "vw.crt", vwCA.pem)

	fromFiles, err := TrustedConfig(&rest.Config{Host: kcp.URL, BearerToken: "t"}, kcpFile, vwFile)
	if err != nil {
		t.Fatal(err)
	}
	// kcpCAFile "" keeps the kubeconfig's CA (data or file); the token is kept
	fromData, err := TrustedConfig(&rest.Config{Host: kcp.URL, TLSClientConfig: rest.TLSClientConfig{CAData: kcpCA.pem}}, "", vwFile)
	if err != nil {
		t.Fatal(err)
	}
	fromFile, err := TrustedConfig(&rest.Config{Host: kcp.URL, TLSClientConfig: rest.TLSClientConfig{CAFile: kcpFile}}, "", vwFile)
	if err != nil {
		t.Fatal(err)
	}
	if fromFiles.BearerToken != "t" || fromFile.CAFile != "" {
		t.Fatalf("credentials or CA file not as expected: %+v", fromFile)
	}
	for _, cfg := range []*rest.Config{fromFiles, fromData, fromFile} {
		for _, url := range []string{kcp.URL, vw.URL} {
			if err := get(cfg, url); err != nil {
				t.Errorf("%s: %v", url, err)
			}
		}
	}
	// only kcp's CA: vwserver's certificate does not verify (the first thing users hit)
	onlyKcp := &rest.Config{Host: kcp.URL, TLSClientConfig: rest.TLSClientConfig{CAData: kcpCA.pem}}
	if err := get(onlyKcp, vw.URL); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("kcp's CA alone verified vwserver: %v", err)
	}
}

func TestTrustedConfigRefusesBadInput(t *testing.T) {
	ca := newCA(t, "x")
	good := write(t, "good.crt", ca.pem)
	key := write(t, "key.pem", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte{1}}))
	junk := write(t, "junk", []byte("not pem"))
	empty := write(t, "empty", nil)
	cases := map[string]struct {
		cfg      *rest.Config
		kcp, vws string
		want     string
	}{
		"insecure":       {&rest.Config{TLSClientConfig: rest.TLSClientConfig{Insecure: true}}, good, good, "skips TLS verification"},
		"no kcp CA":      {&rest.Config{}, "", good, "no kcp CA"},
		"no vwserver CA": {&rest.Config{}, good, "", "vwserverCAFile is empty"},
		"missing file":   {&rest.Config{}, good, filepath.Join(t.TempDir(), "nope"), "no such file"},
		"not PEM":        {&rest.Config{}, junk, good, "not PEM"},
		"a key":          {&rest.Config{}, good, key, "expected CERTIFICATE"},
		"empty":          {&rest.Config{}, good, empty, "no certificate"},
	}
	for name, c := range cases {
		if _, err := TrustedConfig(c.cfg, c.kcp, c.vws); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", name, err, c.want)
		}
	}
}
