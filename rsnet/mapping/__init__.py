"""Land-use maps of whole scenes and regions: rasters classified window by window on every device, resumable, written
as Cloud-Optimised GeoTIFFs with an area table, a mosaic and a preview (docs/usage.md, Mapping a scene)."""
