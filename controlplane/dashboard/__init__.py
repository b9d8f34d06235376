"""The browser dashboard: Django views and pure Plotly figure builders."""
