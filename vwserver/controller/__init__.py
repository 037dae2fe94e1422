"""The embedded controller: FilteredAPIExportEndpointSlices in kcp → status and routes."""
