"""The bundled sample data set (ucmerced-mini), installed as package data; kept at the top of the checkout."""
