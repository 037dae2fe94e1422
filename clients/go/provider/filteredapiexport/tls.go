package filteredapiexport

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"

	"k8s.io/client-go/rest"
)

// TrustedConfig returns a copy of cfg that trusts exactly the CA certificates of kcp and of
// vwserver's serving certificate. The provider reads the slice from kcp with cfg and reuses the
// same config, with only the host swapped, for every endpoint URL of the slice (vwserver):
// both servers' certificates must verify against one bundle.
//
// kcpCAFile "" keeps the CA cfg already has (a kubeconfig's certificate-authority or
// certificate-authority-data); vwserverCAFile is vwserver's serving CA (the issuer of
// tls.certFile, or its chain's root). Each file must hold at least one PEM certificate. cfg's
// credentials are unchanged: the same bearer token goes to kcp and to vwserver, which checks it
// with a TokenReview in the slice's workspace. (A client certificate works towards vwserver only
// if vwserver's tls.clientCAFile trusts its issuer.)
func TrustedConfig(cfg *rest.Config, kcpCAFile, vwserverCAFile string) (*rest.Config, error) {
	if cfg.Insecure {
		return nil, errors.New("filteredapiexport: the config skips TLS verification; refusing to add CAs to it")
	}
	var kcpCA []byte
	var err error
	switch {
	case kcpCAFile != "":
		kcpCA, err = readCerts(kcpCAFile)
	case len(cfg.CAData) > 0:
		kcpCA, err = certs(cfg.CAData, "the config's certificate-authority-data")
	case cfg.CAFile != "":
		kcpCA, err = readCerts(cfg.CAFile)
	default:
		err = errors.New("filteredapiexport: no kcp CA: the config has none and kcpCAFile is empty")
	}
	if err != nil {
		return nil, err
	}
	if vwserverCAFile == "" {
		return nil, errors.New("filteredapiexport: vwserverCAFile is empty")
	}
	vwserverCA, err := readCerts(vwserverCAFile)
	if err != nil {
		return nil, err
	}
	out := rest.CopyConfig(cfg)
	out.CAFile = "" // client-go prefers CAFile over CAData
	out.CAData = append(append(kcpCA, '\n'), vwserverCA...)
	return out, nil
}

func readCerts(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("filteredapiexport: %w", err)
	}
	return certs(data, path)
}

// certs checks that data is PEM with at least one parseable certificate and nothing else.
func certs(data []byte, what string) ([]byte, error) {
	rest, n := bytes.TrimSpace(data), 0
	for len(rest) > 0 {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("filteredapiexport: %s: not PEM", what)
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("filteredapiexport: %s: a %s block, expected CERTIFICATE", what, block.Type)
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return nil, fmt.Errorf("filteredapiexport: %s: %w", what, err)
		}
		n++
		rest = bytes.TrimSpace(rest)
	}
	if n == 0 {
		return nil, fmt.Errorf("filteredapiexport: %s: no certificate", what)
	}
	return bytes.TrimSpace(data), nil
}
